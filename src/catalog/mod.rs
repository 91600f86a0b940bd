//! The tool catalog: every (name, version) with its compiled schemas, what the model may see of it,
//! how versions resolve for a tenant (active and canary), and the access lists it is checked
//! against. Built once per config load; immutable afterwards. Decisions about a caller live in
//! `boundary`, not here.

mod access_lists;
mod backend;
pub mod budgets;
pub mod flow;
mod http_request;
mod load;
pub mod pins;
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

use crate::{
    canonical,
    conditions::{Condition, ToolFacts},
    output_guard::Guard,
    settings::{
        ApprovalsConfig, Env, FieldError, LimitsConfig, Rate, RiskLevel, parse_duration,
        parse_rate,
        raw::{self, RawConfig, RawMcpTool, RawOutputGuard, RawTool},
    },
};
pub use access_lists::{AccessList, Decision, Pattern, TenantPolicy, Verdict};
pub use backend::{
    A2aTarget, BackendContext, BackendSpec, BuiltRequest, BuiltinTool, Discovered, DiscoveredTool,
    HttpTarget, MappingError, McpSource, McpTarget, ProcessSpec, RequestMapping,
};
pub use budgets::{Budget, BudgetPolicy, Handoff};
pub use flow::{FlowPolicy, LabelSet};
pub use load::CatalogInputs;
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
    pub backend: BackendSpec,
    pub bindings: Vec<Binding>,
    pub on_bound_argument: BoundOverride,
    pub rate_limit: Option<Rate>,
    /// The cells of `rate_limit` a call takes, when not one each (`rate_limit.cost`).
    pub quota_cost: Option<Arc<Condition>>,
    /// Whether calls can need approval (its risk level, or `requires_approval`).
    pub requires_approval: bool,
    /// When they do (`approval.when`); without it, every call does.
    pub approval_when: Option<Arc<Condition>>,
    pub max_output_bytes: usize,
    /// How many calls of this version may be in flight in this sidecar (the boundary keeps the
    /// slots: `limits::InFlight`).
    pub max_concurrency: Option<usize>,
    /// Record arguments (audit, spans) and results (spans).
    pub record_arguments: bool,
    /// JSON pointers redacted before recording.
    pub redact: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Hash of everything the model is shown of this version.
    pub definition_hash: String,
    /// The detectors screening its output (shared with the tools that have no section of
    /// their own).
    pub output_guard: Arc<Guard>,
    /// The flow labels a call of it adds to its scope once it ran (`flow`).
    pub flow_labels: LabelSet,
    /// When the tool hands off to another agent: what the sub-agent may do.
    pub handoff: Option<Arc<Handoff>>,
}

impl ToolVersion {
    /// What a condition may know of this tool.
    pub fn facts(&self) -> ToolFacts<'_> {
        ToolFacts {
            name: &self.name,
            version: &self.version,
            risk_level: self.risk_level.as_str(),
        }
    }
}

impl fmt::Debug for ToolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolVersion")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("status", &self.status)
            // Not the backend: a process's resolved environment may hold secrets.
            .field("handoff", &self.handoff)
            .finish_non_exhaustive()
    }
}

/// Why a tool name and optional pin did not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    UnknownTool,
    VersionNotAvailable(String),
    /// Configured, but its backend has not offered it (e.g. its MCP server is down).
    Unavailable(String),
    /// A pinned MCP tool whose server lists another definition: withdrawn until an operator
    /// acts.
    DefinitionChanged(String),
}

/// Why a configured tool is not offered now.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unavailable {
    why: String,
    definition_changed: bool,
}

impl Unavailable {
    fn not_offered(why: String) -> Self {
        Unavailable {
            why,
            definition_changed: false,
        }
    }
}

/// The whole catalog.
#[derive(Debug)]
pub struct Catalog {
    tools: BTreeMap<String, Vec<Arc<ToolVersion>>>,
    /// Configured tools that cannot be offered now, with the reason.
    unavailable: BTreeMap<String, Unavailable>,
    /// Pinned MCP tools their servers list now, by catalog name, whether the pin holds or not.
    pinned: BTreeMap<String, pins::PinnedTool>,
    /// The run-level flow rules, if the catalog has any.
    pub flow: Option<Arc<FlowPolicy>>,
    /// The budgets for a run and a caller's day, if the catalog has any.
    pub budgets: Option<Arc<BudgetPolicy>>,
    /// The keys handoff tools sign their delegations with (`identity.delegation`).
    pub delegation: Option<Arc<crate::identity::delegation::DelegationKeys>>,
    pub policy: AccessList,
    pub tenants: BTreeMap<String, TenantPolicy>,
    pub agents: AgentPolicies,
    /// `identity.platform_tenants`: the tenants whose admins act on every tenant's emergency
    /// denies.
    platform_tenants: BTreeSet<String>,
    /// Whether an access rule's condition can take long to evaluate on a call.
    call_conditions_take_long: bool,
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

impl Catalog {
    /// Whether a condition of the access rules can take long to evaluate on a call (stage 7a
    /// then runs apart from the async workers).
    pub fn call_conditions_take_long(&self) -> bool {
        self.call_conditions_take_long
    }

    /// Whether `tenant` is one of the platform's (`identity.platform_tenants`).
    pub fn is_platform_tenant(&self, tenant: &str) -> bool {
        self.platform_tenants.contains(tenant)
    }

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

    /// Pinned MCP tools as their servers list them now, by catalog name.
    pub fn pinned(&self) -> &BTreeMap<String, pins::PinnedTool> {
        &self.pinned
    }

    /// A tenant's overall quota, if it has one.
    pub fn tenant_rate(&self, tenant: &str) -> Option<Rate> {
        self.tenants.get(tenant).and_then(|t| t.rate_limit)
    }

    /// Every version of every tool.
    pub fn versions(&self) -> impl Iterator<Item = &Arc<ToolVersion>> {
        self.tools.values().flatten()
    }

    /// Version `version` of tool `name`, whatever its status.
    pub fn version(&self, name: &str, version: &str) -> Option<&Arc<ToolVersion>> {
        self.tools
            .get(name)?
            .iter()
            .find(|v| *v.version == *version)
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
                Some(u) if u.definition_changed => ResolveError::DefinitionChanged(u.why.clone()),
                Some(u) => ResolveError::Unavailable(u.why.clone()),
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
            ..DiscoveredTool::default()
        };
        let discovered = Discovered::from([
            ("a".to_owned(), vec![tool("t")]),
            ("b".to_owned(), vec![tool("t"), tool("u")]),
        ]);
        let catalog = config.catalog_inputs.build(&discovered).unwrap();
        let server_of = |name: &str| match &catalog.resolve(name, None, "acme").unwrap().backend {
            BackendSpec::Mcp(tool) => tool.server.clone(),
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
