//! Run-level information-flow rules.

use super::*;

/// Run-level information-flow rules.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFlow {
    /// What the labels are remembered for: `run` (tenant, subject, agent and the client's run
    /// id) or `caller` (tenant, subject and agent, over the window) (default run).
    #[serde(default)]
    pub scope: RawFlowScope,
    /// How long a scope's labels are remembered after its last labelled call (default 1h).
    pub window: Option<String>,
    /// Most scopes one tenant keeps; past it, a new scope evicts the tenant's least recently
    /// labelled one (default 10000).
    pub max_scopes_per_tenant: Option<usize>,
    /// The label names tools may carry (at most 64).
    pub labels: Vec<String>,
    /// The rules, each checked for every call of a tool that carries a label it names.
    #[serde(default)]
    pub rules: Vec<RawFlowRule>,
}

/// Whose history flow rules read.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawFlowScope {
    /// One run of one agent for one subject: the client's `run_id` names it.
    #[default]
    Run,
    /// One agent for one subject, whatever run ids the client sends, over the window.
    Caller,
}

/// One flow rule: once every label of `after` is present in the scope, calls of tools carrying
/// a label of `deny` are refused, or those of `require_approval` need an approval.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFlowRule {
    /// A name for refusals and audit events (default `flow.rules[i]`).
    pub name: Option<String>,
    /// The labels that must all be present.
    pub after: Vec<String>,
    /// Tools carrying any of these labels are refused (`flow_denied`).
    #[serde(default)]
    pub deny: Vec<String>,
    /// Tools carrying any of these labels need an approval.
    #[serde(default)]
    pub require_approval: Vec<String>,
}
