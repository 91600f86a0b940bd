//! Building a catalog from what a catalog file says: each tool version validated and its schemas
//! compiled, MCP tools resolved against what their servers list, bindings, canaries and access
//! lists checked. Done once per load (and again when an MCP server's tools change); the catalog
//! is immutable afterwards.

use super::*;
use crate::settings::parse_quota;

/// Everything a catalog is built from, kept so it can be rebuilt when MCP servers list tools.
pub struct CatalogInputs {
    pub raw: RawConfig,
    pub approvals: ApprovalsConfig,
    pub limits: LimitsConfig,
    pub base_dir: std::path::PathBuf,
    pub env: Env,
    /// Each upstream's base URL, by name.
    pub upstreams: BTreeMap<String, url::Url>,
    pub mcp_servers: Vec<McpSource>,
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
        let ctx = BackendContext {
            upstreams: &self.upstreams,
            upstream_headers: raw
                .upstreams
                .iter()
                .map(|(name, u)| (name.as_str(), u.headers.keys().cloned().collect()))
                .collect(),
            base_dir: &self.base_dir,
            env: &self.env,
        };
        let guard_section = raw.output_guard.as_ref();
        let flow = raw.flow.as_ref().map(FlowPolicy::build).transpose()?;
        let budgets = raw.budgets.as_ref().map(BudgetPolicy::build).transpose()?;
        let delegation =
            crate::identity::delegation::DelegationKeys::from_raw(&raw.identity, &self.base_dir)?;
        let shared = ToolShared {
            can_delegate: delegation.as_ref().is_some_and(|keys| keys.can_issue()),
            flow: flow.as_ref(),
            approvals: &self.approvals,
            limits: &self.limits,
            tenants: &raw.tenants,
            guard: Arc::new(
                Guard::compile(guard_section.map(|g| (g, "output_guard")), None)
                    .map_err(|err| FieldError::new("output_guard", err.to_string()))?,
            ),
            guard_section,
        };
        let mut tools: BTreeMap<String, Vec<Arc<ToolVersion>>> = BTreeMap::new();
        let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (index, raw_tool) in raw.tools.iter().enumerate() {
            let path = format!("tools[{index}]");
            let backend = BackendSpec::build(
                &raw_tool.executor,
                &raw_tool.input_schema,
                &format!("{path}.executor"),
                &ctx,
            )?;
            if let Some(source) = &raw_tool.openapi {
                pins::parse(&source.sha256, &format!("{path}.openapi.sha256"))?;
            }
            let tool = build_tool(raw_tool, &path, &shared, backend)?;
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
        let mut pinned = BTreeMap::new();
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
                    input_schema: json!({"type": "object"}),
                    ..DiscoveredTool::default()
                };
                let pin = settings
                    .pin
                    .as_deref()
                    .map(|pin| pins::parse(pin, &format!("{path}.pin")))
                    .transpose()?;
                let on_change = pins::OnChange::from(
                    settings
                        .on_definition_change
                        .or(raw_server.on_definition_change)
                        .unwrap_or_default(),
                );
                let backend = || {
                    BackendSpec::Mcp(McpTarget {
                        server: server.name.clone(),
                        tool: tool_name.clone(),
                    })
                };
                let check = mcp_raw_tool(&name, settings, &placeholder);
                build_tool(&check, &path, &shared, backend())
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
                if let (Some(found), Some(pin)) = (listed, pin) {
                    let pinned_tool = pins::PinnedTool {
                        server: server.name.clone(),
                        tool: tool_name.clone(),
                        pin,
                        listed: pins::Listed::of(found),
                        on_change,
                    };
                    let holds = pinned_tool.holds();
                    pinned.insert(name.clone(), pinned_tool);
                    if !holds && on_change == pins::OnChange::Withdraw {
                        unavailable.insert(name, Unavailable {
                            why: format!("tool {tool_name} of MCP server {} is withdrawn until an operator reviews it: the server now describes it differently from the definition the catalog pinned", server.name),
                            definition_changed: true,
                        });
                        continue;
                    }
                }
                match listed {
                    None => {
                        unavailable.insert(name, Unavailable::not_offered(format!("tool {tool_name} of MCP server {} is not available: the server is not connected or does not offer it", server.name)));
                    }
                    // Names are unique by construction (tools are checked against MCP names
                    // above, prefixes are unique); should one still be taken when a server lists
                    // a tool, only that tool is left out — never the rebuild of the catalog.
                    Some(_) if tools.contains_key(&name) => {
                        tracing::error!(tool = %name, server = %server.name, "MCP tool clashes with a tool already in the catalog; left out");
                        unavailable.insert(name, Unavailable::not_offered(format!("tool {tool_name} of MCP server {} clashes with another tool of the same name", server.name)));
                    }
                    Some(found) => match build_tool(
                        &mcp_raw_tool(&name, settings, found),
                        &path,
                        &shared,
                        backend(),
                    ) {
                        Ok(tool) => {
                            tools.insert(name, vec![Arc::new(tool)]);
                        }
                        Err(err) => {
                            tracing::error!(tool = %name, error = %err.message, at = %err.path, "MCP tool left out of the catalog");
                            unavailable.insert(name, Unavailable::not_offered(format!("tool {tool_name} of MCP server {} has a definition this catalog cannot use", server.name)));
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
        let tenants: BTreeMap<String, TenantPolicy> = raw
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
        let mut platform_tenants = BTreeSet::new();
        for (index, tenant) in raw.identity.platform_tenants.iter().enumerate() {
            if tenant.trim().is_empty() || tenant.trim() != tenant {
                return Err(FieldError::new(
                    format!("identity.platform_tenants[{index}]"),
                    format!("invalid tenant name {tenant:?}: tenant names are matched exactly"),
                ));
            }
            platform_tenants.insert(tenant.clone());
        }
        let call_conditions_take_long = std::iter::once(&policy)
            .chain(tenants.values().map(|t| &t.access))
            .chain(agents.named.values())
            .chain(agents.default.iter())
            .any(AccessList::conditions_take_long);
        let revision = revision_of(tools.values().flatten().map(|t| t.as_ref()));
        Ok(Catalog {
            platform_tenants,
            call_conditions_take_long,
            flow: flow.map(Arc::new),
            budgets: budgets.map(Arc::new),
            delegation,
            tools,
            unavailable,
            pinned,
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
        rate_limit: settings.rate_limit.clone(),
        requires_approval: settings.requires_approval,
        approval: settings.approval.clone(),
        max_output_bytes: settings.max_output_bytes,
        max_concurrency: settings.max_concurrency,
        record_arguments: false,
        redact: Vec::new(),
        labels: settings.labels.clone(),
        output_guard: settings.output_guard.clone(),
        flow_labels: settings.flow_labels.clone(),
        openapi: None,
        handoff: None,
    }
}

/// What every tool of a catalog is built with.
struct ToolShared<'a> {
    approvals: &'a ApprovalsConfig,
    limits: &'a LimitsConfig,
    tenants: &'a BTreeMap<String, raw::RawTenant>,
    /// The catalog's output guard, compiled once for the tools without their own section.
    guard: Arc<Guard>,
    guard_section: Option<&'a RawOutputGuard>,
    /// The catalog's flow rules, whose labels tools name.
    flow: Option<&'a FlowPolicy>,
    /// Whether the sidecar can sign delegations (a handoff tool needs it).
    can_delegate: bool,
}

fn build_tool(
    raw: &RawTool,
    path: &str,
    shared: &ToolShared<'_>,
    backend: BackendSpec,
) -> Result<ToolVersion, FieldError> {
    let ToolShared {
        approvals,
        limits,
        tenants,
        ..
    } = *shared;
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
        Some(text) => parse_duration(text)
            .map_err(|err| FieldError::new(format!("{path}.timeout"), err.to_string()))?,
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
    if raw.max_concurrency == Some(0) {
        return Err(FieldError::new(
            format!("{path}.max_concurrency"),
            "must be greater than 0",
        ));
    }
    let rate_limit = raw
        .rate_limit
        .as_ref()
        .map(|r| parse_quota(r, &format!("{path}.rate_limit")))
        .transpose()?;
    let quota_cost = match raw.rate_limit.as_ref().and_then(|r| r.cost()) {
        None => None,
        Some(cost) => Some(Arc::new(Condition::compile(cost).map_err(|err| {
            FieldError::new(
                format!("{path}.rate_limit.cost"),
                format!("invalid cost {cost:?}: {err}"),
            )
        })?)),
    };
    let risk_level = RiskLevel::from(raw.risk_level);
    let requires_approval = raw
        .requires_approval
        .unwrap_or_else(|| approvals.risk_levels.contains(&risk_level));
    let approval_when = match &raw.approval {
        None => None,
        Some(approval) => {
            let at = format!("{path}.approval.when");
            if !requires_approval {
                return Err(FieldError::new(
                    at,
                    format!(
                        "a condition on a tool that never needs approval (risk level {}): set requires_approval: true, or list the risk level in approvals.risk_levels",
                        risk_level.as_str()
                    ),
                ));
            }
            let condition = Condition::compile(&approval.when).map_err(|err| {
                FieldError::new(at, format!("invalid condition {:?}: {err}", approval.when))
            })?;
            Some(Arc::new(condition))
        }
    };
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
    let mut definition = json!({
        "name": raw.name,
        "version": version,
        "description": raw.description,
        "input_schema": visible_schema,
        "risk_level": risk_level.as_str(),
        "required_scopes": required_scopes,
        "timeout_ms": timeout.as_millis() as u64,
        "labels": raw.labels,
        "requires_approval": requires_approval,
    });
    // Only when set, so that the hashes of tools without one stay what they were.
    if let (Some(when), Some(map)) = (&approval_when, definition.as_object_mut()) {
        map.insert("approval_when".to_owned(), json!(when.source()));
    }
    let flow_labels = match (shared.flow, raw.flow_labels.is_empty()) {
        (_, true) => LabelSet::default(),
        (Some(flow), false) => flow.set_of(&raw.flow_labels, &format!("{path}.flow_labels"))?,
        (None, false) => {
            return Err(FieldError::new(
                format!("{path}.flow_labels"),
                "flow labels need a flow section declaring them (flow.labels)",
            ));
        }
    };
    // Only when set, so that the hashes of tools without them stay what they were.
    if let (false, Some(map)) = (flow_labels.is_empty(), definition.as_object_mut()) {
        map.insert("flow_labels".to_owned(), json!(raw.flow_labels));
    }
    let handoff = raw
        .handoff
        .as_ref()
        .map(|h| Handoff::build(h, &format!("{path}.handoff")))
        .transpose()?
        .map(Arc::new);
    if handoff.is_some() && !shared.can_delegate {
        return Err(FieldError::new(
            format!("{path}.handoff"),
            "a handoff needs identity.delegation.signing_key_file to sign its delegation",
        ));
    }
    // Only when set, so that the hashes of tools without one stay what they were; as compiled,
    // so a stated default and its absence hash alike.
    if let (Some(handoff), Some(map)) = (&handoff, definition.as_object_mut()) {
        map.insert("handoff".to_owned(), json!(format!("{handoff:?}")));
    }
    let definition_hash = canonical::sha256_hex(&definition);
    let output_guard = match &raw.output_guard {
        None => shared.guard.clone(),
        Some(own) => {
            let at = format!("{path}.output_guard");
            let catalog = shared.guard_section.map(|g| (g, "output_guard"));
            Arc::new(
                Guard::compile(catalog, Some((own, &at)))
                    .map_err(|err| FieldError::new(at.clone(), err.to_string()))?,
            )
        }
    };
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
        backend,
        bindings,
        on_bound_argument: match raw.on_bound_argument {
            raw::RawBoundOverride::Deny => BoundOverride::Deny,
            raw::RawBoundOverride::Overwrite => BoundOverride::Overwrite,
        },
        rate_limit,
        quota_cost,
        requires_approval,
        approval_when,
        max_output_bytes,
        max_concurrency: raw.max_concurrency,
        record_arguments: raw.record_arguments,
        redact: raw.redact.clone(),
        labels: raw.labels.clone(),
        definition_hash,
        output_guard,
        flow_labels,
        handoff,
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
