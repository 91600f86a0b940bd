//! The tool catalog: every (name, version) with its compiled schemas, what the model may see of it,
//! how versions resolve for a tenant (active and canary), and the access lists it is checked
//! against. Built once per config load; immutable afterwards. Decisions about a caller live in
//! `boundary`, not here.

mod schema;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
    time::Duration,
};

use globset::{Glob, GlobMatcher};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::{
    canonical,
    executor::{
        BuildContext, ExecutorSpec, McpTool, Upstream,
        mcp::{Discovered, DiscoveredTool, McpServerConfig},
    },
    settings::{
        ApprovalsConfig, Env, FieldError, LimitsConfig, Rate, RiskLevel, parse_duration,
        parse_rate,
        raw::{self, RawConfig, RawMcpTool, RawTool},
    },
};
pub use schema::{BindValue, Binding};

/// Whether a version is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionStatus {
    Active,
    Canary,
    Inactive,
}

/// Who gets a canary version.
#[derive(Debug, Clone)]
pub struct Canary {
    pub tenants: BTreeSet<String>,
    pub percent: u8,
}

impl Canary {
    /// Listed tenants always; others by a stable hash of (tool, tenant), so a tenant keeps landing
    /// on the same side across restarts and replicas.
    pub fn includes(&self, tool: &str, tenant: &str) -> bool {
        self.tenants.contains(tenant) || stable_bucket(tool, tenant) < u64::from(self.percent)
    }
}

/// A number in 0..100 that depends only on (tool, tenant).
pub fn stable_bucket(tool: &str, tenant: &str) -> u64 {
    let digest = Sha256::new()
        .chain_update(tool.as_bytes())
        .chain_update([0u8])
        .chain_update(tenant.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) % 100
}

/// What to do when the model sends a bound argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundOverride {
    Deny,
    Overwrite,
}

/// One version of one tool, ready to serve.
pub struct ToolVersion {
    pub name: String,
    /// Shared, not copied, by the spans and audit events of its calls.
    pub version: Arc<str>,
    pub description: String,
    /// The schema as written in the catalog.
    pub input_schema: Value,
    /// The schema the model sees: bound properties removed.
    pub visible_schema: Value,
    /// `visible_schema` as compact JSON text, rendered once.
    pub visible_schema_json: String,
    /// Validates model arguments (bound keys excluded) against `visible_schema`.
    pub validator: jsonschema::Validator,
    /// For tools with bindings: validates the final, bound arguments against `input_schema`.
    pub full_validator: Option<jsonschema::Validator>,
    pub output_schema: Option<Value>,
    pub risk_level: RiskLevel,
    pub required_scopes: Vec<String>,
    pub timeout: Duration,
    pub status: VersionStatus,
    pub canary: Option<Canary>,
    pub executor: ExecutorSpec,
    pub bindings: Vec<Binding>,
    pub on_bound_argument: BoundOverride,
    pub rate_limit: Option<Rate>,
    pub requires_approval: bool,
    pub max_output_bytes: usize,
    /// Calls of this version in flight, when the catalog caps them, and the cap.
    pub concurrency: Option<Arc<Semaphore>>,
    pub max_concurrency: Option<usize>,
    /// Record arguments (audit, spans) and results (spans).
    pub record_arguments: bool,
    /// JSON pointers redacted before recording.
    pub redact: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Hash of everything the model is shown of this version.
    pub definition_hash: String,
}

impl fmt::Debug for ToolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolVersion")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// A glob over tool names, kept with its text so refusals can name it, and where the catalog
/// defines it (e.g. `tenants.globex.deny[0]`) so explanations can point at it.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub text: String,
    pub location: String,
    matcher: GlobMatcher,
}

impl Pattern {
    fn compile(text: &str, path: &str) -> Result<Self, FieldError> {
        let glob = Glob::new(text)
            .map_err(|err| FieldError::new(path, format!("invalid glob {text:?}: {err}")))?;
        Ok(Pattern {
            text: text.to_owned(),
            location: path.to_owned(),
            matcher: glob.compile_matcher(),
        })
    }

    pub fn matches(&self, tool: &str) -> bool {
        self.matcher.is_match(tool)
    }
}

/// Allow and deny globs; deny wins, and a set allow list admits only what it matches.
#[derive(Debug, Clone, Default)]
pub struct AccessList {
    pub allow: Option<Vec<Pattern>>,
    pub deny: Vec<Pattern>,
    /// Where the catalog defines the list, e.g. `tenants.globex` or `policy`.
    pub location: String,
}

/// What decided an access list's answer for one tool.
#[derive(Debug, Clone, Copy)]
pub enum Verdict<'a> {
    /// Admitted: by this allow pattern, or with no allow list set (`None`).
    Allowed(Option<&'a Pattern>),
    /// This deny pattern matched.
    Denied(&'a Pattern),
    /// An allow list is set and nothing in it matched.
    NotAllowed,
}

/// Why an access list refused a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessDenial {
    /// A deny pattern matched.
    Denied(String),
    /// An allow list is set and nothing in it matched.
    NotAllowed,
}

impl AccessList {
    pub fn check(&self, tool: &str) -> Result<(), AccessDenial> {
        match self.decide(tool) {
            Verdict::Allowed(_) => Ok(()),
            Verdict::Denied(hit) => Err(AccessDenial::Denied(hit.text.clone())),
            Verdict::NotAllowed => Err(AccessDenial::NotAllowed),
        }
    }

    /// The list's answer for `tool` and the pattern that gave it: deny first, then allow.
    pub fn decide(&self, tool: &str) -> Verdict<'_> {
        if let Some(hit) = self.deny.iter().find(|p| p.matches(tool)) {
            return Verdict::Denied(hit);
        }
        match &self.allow {
            Some(allow) => match allow.iter().find(|p| p.matches(tool)) {
                Some(hit) => Verdict::Allowed(Some(hit)),
                None => Verdict::NotAllowed,
            },
            None => Verdict::Allowed(None),
        }
    }

    fn build(
        allow: &Option<Vec<String>>,
        deny: &[String],
        path: &str,
        tool_names: &BTreeSet<&str>,
    ) -> Result<Self, FieldError> {
        let compile_all = |texts: &[String], field: &str| {
            texts
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    let at = format!("{path}.{field}[{i}]");
                    let pattern = Pattern::compile(text, &at)?;
                    // A pattern that matches nothing is almost always a typo that silently
                    // widens or narrows access.
                    if !tool_names.iter().any(|name| pattern.matches(name)) {
                        return Err(FieldError::new(
                            at,
                            format!("pattern {text:?} matches no tool in the catalog"),
                        ));
                    }
                    Ok(pattern)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(AccessList {
            allow: allow
                .as_ref()
                .map(|a| compile_all(a, "allow"))
                .transpose()?,
            deny: compile_all(deny, "deny")?,
            location: path.to_owned(),
        })
    }
}

/// One tenant's policy.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    pub access: AccessList,
    pub rate_limit: Option<Rate>,
}

/// Why a tool name and optional pin did not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    UnknownTool,
    VersionNotAvailable(String),
    /// Configured, but its backend has not offered it (e.g. its MCP server is down).
    Unavailable(String),
}

/// The whole catalog.
#[derive(Debug)]
pub struct Catalog {
    tools: BTreeMap<String, Vec<Arc<ToolVersion>>>,
    /// Configured tools that cannot be offered now, with the reason.
    unavailable: BTreeMap<String, String>,
    pub policy: AccessList,
    pub tenants: BTreeMap<String, TenantPolicy>,
    pub agents: AgentPolicies,
    revision: String,
}

/// The agents' access lists. Agent names are matched exactly (case-sensitive): a different
/// spelling is an unknown agent.
#[derive(Debug, Clone, Default)]
pub struct AgentPolicies {
    /// Listed agents by name.
    pub named: BTreeMap<String, AccessList>,
    /// The `"*"` entry: what unknown agents (and callers naming none) get.
    pub default: Option<AccessList>,
}

/// The key of the default entry in `agents`.
pub const DEFAULT_AGENT: &str = "*";

/// Which agent policy applies to a caller.
#[derive(Debug, Clone, Copy)]
pub enum AgentPolicy<'a> {
    /// No agents are configured: agents are not narrowed.
    Unrestricted,
    /// The caller's agent is listed.
    Named(&'a AccessList),
    /// The caller's agent is unknown (or unnamed) and this is the `"*"` entry.
    Default(&'a AccessList),
    /// Agents are configured, this one is unknown and there is no `"*"` entry: fail closed.
    Unknown,
}

impl AgentPolicies {
    pub fn for_agent(&self, agent: &str) -> AgentPolicy<'_> {
        if let Some(list) = self.named.get(agent) {
            return AgentPolicy::Named(list);
        }
        match &self.default {
            Some(list) => AgentPolicy::Default(list),
            None if self.named.is_empty() => AgentPolicy::Unrestricted,
            None => AgentPolicy::Unknown,
        }
    }
}

/// Everything a catalog is built from, kept so it can be rebuilt when MCP servers list tools.
pub struct CatalogInputs {
    pub raw: RawConfig,
    pub approvals: ApprovalsConfig,
    pub limits: LimitsConfig,
    pub base_dir: std::path::PathBuf,
    pub env: Env,
    pub upstreams: BTreeMap<String, Arc<Upstream>>,
    pub mcp_servers: Vec<McpServerConfig>,
}

impl std::fmt::Debug for CatalogInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogInputs")
            .field("tools", &self.raw.tools.len())
            .finish_non_exhaustive()
    }
}

impl CatalogInputs {
    /// Validates and compiles the catalog, with the MCP tools discovered so far. Configured
    /// tools are always checked; an MCP tool whose server-provided schema does not fit is left
    /// out (and logged) rather than failing the catalog.
    pub fn build(&self, discovered: &Discovered) -> Result<Catalog, FieldError> {
        let raw = &self.raw;
        let ctx = BuildContext {
            upstreams: &self.upstreams,
            base_dir: &self.base_dir,
            env: &self.env,
        };
        let mut tools: BTreeMap<String, Vec<Arc<ToolVersion>>> = BTreeMap::new();
        let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (index, raw_tool) in raw.tools.iter().enumerate() {
            let path = format!("tools[{index}]");
            let executor =
                ExecutorSpec::build(&raw_tool.executor, &format!("{path}.executor"), &ctx)?;
            let tool = build_tool(
                raw_tool,
                &path,
                &self.approvals,
                &self.limits,
                &raw.tenants,
                executor,
            )?;
            let key = (tool.name.clone(), tool.version.to_string());
            if let Some(first) = seen.insert(key, index) {
                return Err(FieldError::new(
                    format!("{path}.version"),
                    format!(
                        "duplicate tool {:?} version {:?} (first defined at tools[{first}])",
                        tool.name, tool.version
                    ),
                ));
            }
            let versions = tools.entry(tool.name.clone()).or_default();
            if tool.status == VersionStatus::Active
                && let Some(other) = versions.iter().find(|v| v.status == VersionStatus::Active)
            {
                return Err(FieldError::new(
                    format!("{path}.status"),
                    format!(
                        "tool {:?} already has an active version {:?}; mark one inactive or canary",
                        tool.name, other.version
                    ),
                ));
            }
            versions.push(Arc::new(tool));
        }
        let mut unavailable = BTreeMap::new();
        for server in &self.mcp_servers {
            let Some(raw_server) = raw.mcp_servers.get(&server.name) else {
                continue;
            };
            for (tool_name, settings) in &raw_server.tools {
                let name = format!("{}.{tool_name}", server.prefix);
                let path = format!("mcp_servers.{}.tools.{tool_name}", server.name);
                // Checked against the configuration, not what servers listed, so the answer is
                // the same at load and at every rebuild.
                if raw.tools.iter().any(|t| t.name == name) {
                    return Err(FieldError::new(
                        path,
                        format!("tool {name:?} is also defined in tools"),
                    ));
                }
                // Settings are checked even before the server is reached.
                let placeholder = DiscoveredTool {
                    name: tool_name.clone(),
                    description: String::new(),
                    input_schema: json!({"type": "object"}),
                };
                let executor = || {
                    ExecutorSpec::Mcp(McpTool {
                        server: server.name.clone(),
                        tool: tool_name.clone(),
                    })
                };
                let check = mcp_raw_tool(&name, settings, &placeholder);
                build_tool(
                    &check,
                    &path,
                    &self.approvals,
                    &self.limits,
                    &raw.tenants,
                    executor(),
                )
                .map(|_| ())
                .or_else(|err| {
                    // Bindings can only be checked against the server's schema.
                    if err.path.starts_with(&format!("{path}.bind")) {
                        Ok(())
                    } else {
                        Err(err)
                    }
                })?;
                let listed = discovered
                    .get(&server.name)
                    .and_then(|list| list.iter().find(|t| &t.name == tool_name));
                match listed {
                    None => {
                        unavailable.insert(name, format!("tool {tool_name} of MCP server {} is not available: the server is not connected or does not offer it", server.name));
                    }
                    // Names are unique by construction (tools are checked against MCP names
                    // above, prefixes are unique); should one still be taken when a server lists
                    // a tool, only that tool is left out — never the rebuild of the catalog.
                    Some(_) if tools.contains_key(&name) => {
                        tracing::error!(tool = %name, server = %server.name, "MCP tool clashes with a tool already in the catalog; left out");
                        unavailable.insert(name, format!("tool {tool_name} of MCP server {} clashes with another tool of the same name", server.name));
                    }
                    Some(found) => match build_tool(
                        &mcp_raw_tool(&name, settings, found),
                        &path,
                        &self.approvals,
                        &self.limits,
                        &raw.tenants,
                        executor(),
                    ) {
                        Ok(tool) => {
                            tools.insert(name, vec![Arc::new(tool)]);
                        }
                        Err(err) => {
                            tracing::error!(tool = %name, error = %err.message, at = %err.path, "MCP tool left out of the catalog");
                            unavailable.insert(name, format!("tool {tool_name} of MCP server {} has a definition this catalog cannot use", server.name));
                        }
                    },
                }
            }
        }
        let names: BTreeSet<&str> = tools
            .keys()
            .chain(unavailable.keys())
            .map(String::as_str)
            .collect();
        let policy = AccessList::build(&raw.policy.allow, &raw.policy.deny, "policy", &names)?;
        let tenants = raw
            .tenants
            .iter()
            .map(|(tenant, t)| {
                let path = format!("tenants.{tenant}");
                let access = AccessList::build(&t.allow, &t.deny, &path, &names)?;
                let rate_limit = t
                    .rate_limit
                    .as_ref()
                    .map(|r| parse_rate(r, &format!("{path}.rate_limit")))
                    .transpose()?;
                Ok((tenant.clone(), TenantPolicy { access, rate_limit }))
            })
            .collect::<Result<_, FieldError>>()?;
        let mut agents = AgentPolicies::default();
        for (agent, a) in &raw.agents {
            let path = format!("agents.{agent}");
            if agent.trim().is_empty() || agent.trim() != agent {
                return Err(FieldError::new(
                    path,
                    format!("invalid agent name {agent:?}: agent names are matched exactly"),
                ));
            }
            let access = AccessList::build(&a.allow, &a.deny, &path, &names)?;
            if agent == DEFAULT_AGENT {
                agents.default = Some(access);
            } else {
                agents.named.insert(agent.clone(), access);
            }
        }
        let revision = revision_of(tools.values().flatten().map(|t| t.as_ref()));
        Ok(Catalog {
            tools,
            unavailable,
            policy,
            tenants,
            agents,
            revision,
        })
    }
}

/// A catalog entry for an MCP tool: the server's name, description and schema, the catalog's
/// settings for everything that decides whether and how it runs.
fn mcp_raw_tool(name: &str, settings: &RawMcpTool, found: &DiscoveredTool) -> RawTool {
    let description = settings
        .description
        .clone()
        .filter(|d| !d.trim().is_empty())
        .or_else(|| Some(found.description.clone()).filter(|d| !d.trim().is_empty()))
        .unwrap_or_else(|| format!("MCP tool {}", found.name));
    RawTool {
        name: name.to_owned(),
        version: Some("1".to_owned()),
        description,
        input_schema: found.input_schema.clone(),
        output_schema: None,
        risk_level: settings.risk_level,
        required_scopes: settings.required_scopes.clone(),
        timeout: settings.timeout.clone(),
        status: raw::RawToolStatus::Active,
        canary: None,
        executor: raw::RawExecutor::default(),
        bind: settings.bind.clone(),
        on_bound_argument: settings.on_bound_argument,
        rate_limit: settings.rate_limit.as_ref().map(|r| match r {
            raw::RawRateLimit::Short(q) => raw::RawRateLimit::Short(q.clone()),
            raw::RawRateLimit::Full { quota, burst } => raw::RawRateLimit::Full {
                quota: quota.clone(),
                burst: *burst,
            },
        }),
        requires_approval: settings.requires_approval,
        max_output_bytes: settings.max_output_bytes,
        max_concurrency: settings.max_concurrency,
        record_arguments: false,
        redact: Vec::new(),
        labels: settings.labels.clone(),
    }
}

impl Catalog {
    /// Whether the catalog configures a tool of this name (available now or not).
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name) || self.unavailable.contains_key(name)
    }

    /// Tool names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Configured tools that cannot be offered now (e.g. their MCP server is down), sorted.
    pub fn unavailable_names(&self) -> impl Iterator<Item = &str> {
        self.unavailable.keys().map(String::as_str)
    }

    /// Every version of every tool.
    pub fn versions(&self) -> impl Iterator<Item = &Arc<ToolVersion>> {
        self.tools.values().flatten()
    }

    /// Takes over the live concurrency slots of `previous` for every version whose cap is
    /// unchanged, so calls already running keep counting against it: a rebuild (reload, an MCP
    /// server's list change) in the middle of load cannot let twice the cap through.
    pub fn adopt_concurrency(&mut self, previous: &Catalog) {
        for (name, versions) in &mut self.tools {
            for version in versions.iter_mut() {
                let Some(cap) = version.max_concurrency else {
                    continue;
                };
                let live = previous
                    .tools
                    .get(name)
                    .and_then(|old| old.iter().find(|v| v.version == version.version))
                    .filter(|old| old.max_concurrency == Some(cap))
                    .and_then(|old| old.concurrency.clone());
                // A version just built is not shared yet.
                if let (Some(live), Some(fresh)) = (live, Arc::get_mut(version)) {
                    fresh.concurrency = Some(live);
                }
            }
        }
    }

    /// A hash of the whole catalog, for logs and metrics.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The version of `name` this tenant gets: the pinned one if it may use it, otherwise the first
    /// canary it is in, otherwise the active one.
    pub fn resolve(
        &self,
        name: &str,
        pin: Option<&str>,
        tenant: &str,
    ) -> Result<&Arc<ToolVersion>, ResolveError> {
        let Some(versions) = self.tools.get(name) else {
            return Err(match self.unavailable.get(name) {
                Some(why) => ResolveError::Unavailable(why.clone()),
                None => ResolveError::UnknownTool,
            });
        };
        let usable = |v: &ToolVersion| match v.status {
            VersionStatus::Active => true,
            VersionStatus::Canary => v.canary.as_ref().is_some_and(|c| c.includes(name, tenant)),
            VersionStatus::Inactive => false,
        };
        if let Some(pin) = pin {
            let version = versions
                .iter()
                .find(|v| *v.version == *pin)
                .ok_or_else(|| {
                    ResolveError::VersionNotAvailable(format!("tool {name} has no version {pin}"))
                })?;
            return if usable(version) {
                Ok(version)
            } else if version.status == VersionStatus::Inactive {
                Err(ResolveError::VersionNotAvailable(format!(
                    "version {pin} of tool {name} is inactive"
                )))
            } else {
                Err(ResolveError::VersionNotAvailable(format!(
                    "version {pin} of tool {name} is a canary this tenant is not in"
                )))
            };
        }
        versions
            .iter()
            .find(|v| v.status == VersionStatus::Canary && usable(v))
            .or_else(|| versions.iter().find(|v| v.status == VersionStatus::Active))
            .ok_or_else(|| {
                ResolveError::VersionNotAvailable(format!(
                    "tool {name} has no version available to this tenant"
                ))
            })
    }
}

/// A stable hash of a set of tool versions' visible definitions, in the order given.
pub fn revision_of<'a>(versions: impl Iterator<Item = &'a ToolVersion>) -> String {
    let mut hasher = Sha256::new();
    for v in versions {
        hasher.update(v.name.as_bytes());
        hasher.update([0]);
        hasher.update(v.definition_hash.as_bytes());
        hasher.update([0]);
    }
    crate::canonical::lower_hex(&hasher.finalize()[..16])
}

fn build_tool(
    raw: &RawTool,
    path: &str,
    approvals: &ApprovalsConfig,
    limits: &LimitsConfig,
    tenants: &BTreeMap<String, raw::RawTenant>,
    executor: ExecutorSpec,
) -> Result<ToolVersion, FieldError> {
    validate_name(&raw.name, &format!("{path}.name"))?;
    let version = raw.version.clone().unwrap_or_else(|| "1".to_owned());
    if version.trim().is_empty() {
        return Err(FieldError::new(
            format!("{path}.version"),
            "must not be blank",
        ));
    }
    if raw.description.trim().is_empty() {
        return Err(FieldError::new(
            format!("{path}.description"),
            "must not be blank: the model chooses tools by their description",
        ));
    }
    let schema_path = format!("{path}.input_schema");
    if raw.input_schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(FieldError::new(
            &schema_path,
            "must be a JSON Schema with \"type\": \"object\" (tool arguments are an object)",
        ));
    }
    let full_validator = schema::compile(&raw.input_schema, &schema_path)?;
    let bindings = schema::parse_bindings(&raw.bind, &raw.input_schema, &format!("{path}.bind"))?;
    let visible_schema = schema::strip_bound(&raw.input_schema, &bindings);
    let validator = schema::compile(&visible_schema, &schema_path)?;
    if let Some(output) = &raw.output_schema {
        schema::compile(output, &format!("{path}.output_schema"))?;
    }
    let timeout = match &raw.timeout {
        Some(text) => {
            parse_duration(text).map_err(|m| FieldError::new(format!("{path}.timeout"), m))?
        }
        None => Duration::from_secs(30),
    };
    let status = match raw.status {
        raw::RawToolStatus::Active => VersionStatus::Active,
        raw::RawToolStatus::Canary => VersionStatus::Canary,
        raw::RawToolStatus::Inactive => VersionStatus::Inactive,
    };
    let canary = match (&raw.canary, status) {
        (Some(c), VersionStatus::Canary) => {
            if c.percent > 100 {
                return Err(FieldError::new(
                    format!("{path}.canary.percent"),
                    "must be 0-100",
                ));
            }
            for (i, tenant) in c.tenants.iter().enumerate() {
                if !tenants.contains_key(tenant) {
                    return Err(FieldError::new(
                        format!("{path}.canary.tenants[{i}]"),
                        format!("unknown tenant {tenant:?}"),
                    ));
                }
            }
            Some(Canary {
                tenants: c.tenants.iter().cloned().collect(),
                percent: c.percent,
            })
        }
        (None, VersionStatus::Canary) => {
            return Err(FieldError::new(
                format!("{path}.canary"),
                "a canary version needs a canary block (tenants and/or percent)",
            ));
        }
        (Some(_), _) => {
            return Err(FieldError::new(
                format!("{path}.canary"),
                "only versions with status: canary take a canary block",
            ));
        }
        (None, _) => None,
    };
    for (i, pointer) in raw.redact.iter().enumerate() {
        if !pointer.starts_with('/') {
            return Err(FieldError::new(
                format!("{path}.redact[{i}]"),
                format!("{pointer:?} is not a JSON pointer; write e.g. /card/number"),
            ));
        }
    }
    for (i, scope) in raw.required_scopes.iter().enumerate() {
        if scope.trim().is_empty() || scope.contains(char::is_whitespace) {
            return Err(FieldError::new(
                format!("{path}.required_scopes[{i}]"),
                format!("invalid scope {scope:?}"),
            ));
        }
    }
    let concurrency = match raw.max_concurrency {
        Some(0) => {
            return Err(FieldError::new(
                format!("{path}.max_concurrency"),
                "must be greater than 0",
            ));
        }
        Some(n) => Some(Arc::new(Semaphore::new(n))),
        None => None,
    };
    let rate_limit = raw
        .rate_limit
        .as_ref()
        .map(|r| parse_rate(r, &format!("{path}.rate_limit")))
        .transpose()?;
    let risk_level = RiskLevel::from(raw.risk_level);
    let requires_approval = raw
        .requires_approval
        .unwrap_or_else(|| approvals.risk_levels.contains(&risk_level));
    let max_output_bytes = match raw.max_output_bytes {
        Some(0) => {
            return Err(FieldError::new(
                format!("{path}.max_output_bytes"),
                "must be greater than 0",
            ));
        }
        Some(n) => n,
        None => limits.max_output_bytes,
    };
    let visible_schema_json = visible_schema.to_string();
    let mut required_scopes = raw.required_scopes.clone();
    required_scopes.sort();
    required_scopes.dedup();
    let definition_hash = canonical::sha256_hex(&json!({
        "name": raw.name,
        "version": version,
        "description": raw.description,
        "input_schema": visible_schema,
        "risk_level": risk_level.as_str(),
        "required_scopes": required_scopes,
        "timeout_ms": timeout.as_millis() as u64,
        "labels": raw.labels,
        "requires_approval": requires_approval,
    }));
    Ok(ToolVersion {
        name: raw.name.clone(),
        version: version.into(),
        description: raw.description.clone(),
        input_schema: raw.input_schema.clone(),
        visible_schema,
        visible_schema_json,
        validator,
        full_validator: (!bindings.is_empty()).then_some(full_validator),
        output_schema: raw.output_schema.clone(),
        risk_level,
        required_scopes,
        timeout,
        status,
        canary,
        executor,
        bindings,
        on_bound_argument: match raw.on_bound_argument {
            raw::RawBoundOverride::Deny => BoundOverride::Deny,
            raw::RawBoundOverride::Overwrite => BoundOverride::Overwrite,
        },
        rate_limit,
        requires_approval,
        max_output_bytes,
        concurrency,
        max_concurrency: raw.max_concurrency,
        record_arguments: raw.record_arguments,
        redact: raw.redact.clone(),
        labels: raw.labels.clone(),
        definition_hash,
    })
}

/// Tool names that every model provider accepts, plus `.` for MCP prefixes.
fn validate_name(name: &str, path: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            path,
            format!("invalid tool name {name:?}: use 1-64 characters from A-Z a-z 0-9 _ - ."),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_stable_and_spread() {
        assert_eq!(stable_bucket("t", "acme"), stable_bucket("t", "acme"));
        let buckets: BTreeSet<u64> = (0..1000)
            .map(|i| stable_bucket("t", &format!("tenant{i}")))
            .collect();
        assert!(buckets.len() > 90, "poor spread: {}", buckets.len());
    }

    #[test]
    fn a_clash_among_listed_mcp_tools_leaves_out_only_the_clashing_tool() {
        let yaml = "version: 1\nidentity: { dev_identity: true }\ntenants: { acme: {} }\nmcp_servers:\n  a: { command: [\"true\"], tools: { t: { risk_level: read_only } } }\n  b: { command: [\"true\"], tools: { t: { risk_level: read_only }, u: { risk_level: read_only } } }\n";
        let mut config = crate::config::Config::from_yaml(
            yaml,
            "t.yaml",
            std::path::Path::new("."),
            &Env::default(),
        )
        .unwrap();
        // Prefixes are unique at load; force the clash the catalog must survive anyway.
        config.catalog_inputs.mcp_servers[1].prefix = "a".into();
        let tool = |name: &str| DiscoveredTool {
            name: name.into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
        };
        let discovered = Discovered::from([
            ("a".to_owned(), vec![tool("t")]),
            ("b".to_owned(), vec![tool("t"), tool("u")]),
        ]);
        let catalog = config.catalog_inputs.build(&discovered).unwrap();
        let server_of = |name: &str| match &catalog.resolve(name, None, "acme").unwrap().executor {
            ExecutorSpec::Mcp(tool) => tool.server.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(server_of("a.t"), "a", "the first server keeps its tool");
        assert_eq!(
            server_of("a.u"),
            "b",
            "the other server's other tools are served"
        );
        assert_eq!(catalog.names().collect::<Vec<_>>(), ["a.t", "a.u"]);
    }
}
