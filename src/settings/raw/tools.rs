//! The tools: one entry per (name, version), with its backend.

use super::*;

/// A tool's risk level.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum RawRiskLevel {
    ReadOnly,
    WriteDraft,
    WriteConfirmed,
    Destructive,
}

/// Whether a version is offered.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawToolStatus {
    #[default]
    Active,
    Canary,
    Inactive,
}

/// One version of one tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTool {
    /// The tool's name as the model sees it.
    pub name: String,
    /// The version (default "1"); (name, version) is unique.
    pub version: Option<String>,
    /// What the tool does, written for the model.
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: serde_json::Value,
    /// Optional JSON Schema of the output, for documentation.
    pub output_schema: Option<serde_json::Value>,
    /// What the tool can change.
    pub risk_level: RawRiskLevel,
    /// Scopes the caller needs.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// Execution timeout (default 30s).
    pub timeout: Option<String>,
    /// active, canary or inactive (default active).
    #[serde(default)]
    pub status: RawToolStatus,
    /// Who gets a canary version: listed tenants, plus a stable share of all tenants.
    pub canary: Option<RawCanary>,
    /// How the tool runs.
    pub executor: RawExecutor,
    /// Server-bound arguments: dotted argument path -> `${caller.tenant}`, `${caller.subject}`,
    /// `${caller.agent}` or a constant. Hidden from the model and written after validation.
    #[serde(default)]
    pub bind: BTreeMap<String, serde_json::Value>,
    /// What to do when the model sends a bound argument itself (default deny).
    #[serde(default)]
    pub on_bound_argument: RawBoundOverride,
    /// Per-tenant rate limit for this tool, e.g. `5/min`.
    pub rate_limit: Option<RawRateLimit>,
    /// Override whether the tool needs approval (default: by risk level).
    pub requires_approval: Option<bool>,
    /// When a tool that can need approval (by its risk level or `requires_approval`) needs it.
    pub approval: Option<RawToolApproval>,
    /// Largest output returned, in bytes.
    pub max_output_bytes: Option<usize>,
    /// Most calls of this tool in flight at once; beyond it calls are refused at once.
    pub max_concurrency: Option<usize>,
    /// Record the (bound) arguments in audit events and arguments and result in spans.
    #[serde(default)]
    pub record_arguments: bool,
    /// JSON pointers (e.g. `/card/number`) whose values are replaced before recording.
    #[serde(default)]
    pub redact: Vec<String>,
    /// Free-form labels shown to callers.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// This tool's output guard, over the catalog's: its `secrets` and each detector it names
    /// replace the catalog's, its custom detectors are added.
    pub output_guard: Option<RawOutputGuard>,
    /// The flow labels (declared in `flow.labels`) a call of this tool adds to its flow scope
    /// once it ran, and that `flow.rules` match.
    #[serde(default)]
    pub flow_labels: Vec<String>,
    /// The OpenAPI operation this entry was imported from (`toolgate import openapi` writes it):
    /// `toolgate check --spec-drift` reports an operation whose definition changed since.
    pub openapi: Option<RawOpenapiSource>,
    /// This tool hands the call to another agent (docs/handoff.md): its backend (a2a, http)
    /// receives a delegation token that keeps the person as the caller and narrows the
    /// sub-agent to these tools, this depth and this budget. The tool's `timeout` is the
    /// handoff's.
    pub handoff: Option<RawHandoff>,
}

/// A handoff: what the sub-agent may do under it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHandoff {
    /// The sub-agent's name: the agent its calls are made as.
    pub agent: String,
    /// The tools the sub-agent may use (globs, at least one); intersected with what the caller
    /// may use: a handoff never widens.
    pub allow: Vec<String>,
    /// Tools it may never use (globs).
    #[serde(default)]
    pub deny: Vec<String>,
    /// The deepest the chain of handoffs may go from the root caller (default 2; at most 16):
    /// a handoff that would go deeper is refused (`handoff_too_deep`).
    pub max_depth: Option<u32>,
    /// What the sub-agent (and every agent it hands off to) may spend under this handoff, on
    /// top of the run's own budget, which it shares.
    pub budget: Option<RawBudget>,
}

/// Where an imported tool came from, and what it was then.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOpenapiSource {
    /// The description file, relative to the catalog file's directory.
    pub spec: String,
    /// The operation: its operationId, or `METHOD /path`.
    pub operation: String,
    /// `sha256:` and the hex SHA-256 of the entry the import made from it (its name and
    /// upstream aside), as reviewed.
    pub sha256: String,
}

/// Who gets a canary version.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCanary {
    /// Tenants that always get the canary.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Share of all other tenants, 0-100, chosen by a stable hash of the tenant.
    #[serde(default)]
    pub percent: u8,
}

/// What happens when the model sends a bound argument.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawBoundOverride {
    /// Refuse the call with DENIED.
    #[default]
    Deny,
    /// Replace the model's value with the bound one.
    Overwrite,
}

/// A rate limit: `N/s`, `N/min` or `N/h`, or that with a burst (and, for a tool, a cost).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawRateLimit {
    /// e.g. `5/min`.
    Short(String),
    /// A quota with an explicit burst or cost.
    Full(RawQuota),
}

impl RawRateLimit {
    /// The cost expression, when one is written.
    pub fn cost(&self) -> Option<&str> {
        match self {
            RawRateLimit::Short(_) => None,
            RawRateLimit::Full(full) => full.cost.as_deref(),
        }
    }
}

/// A quota written out.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawQuota {
    /// e.g. `5/min`.
    pub quota: String,
    /// Calls (cells) allowed at once before the rate applies (default: the quota's count).
    pub burst: Option<u32>,
    /// A tool's quota only: a CEL expression giving the cells a call takes, e.g.
    /// `int(args.top_k)` (default 1; docs/conditions.md). Zero takes none; a negative value,
    /// an error or a value that is not an integer refuses the call (`condition_error`), and
    /// more than the burst refuses it as never admissible (`cost_over_burst`).
    pub cost: Option<String>,
}

/// How a tool runs: exactly one backend.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawExecutor {
    /// A tool built into toolgate, by name (e.g. `echo`).
    pub builtin: Option<String>,
    /// Call a configured upstream: by default POST the arguments as JSON; a method, a path
    /// template, query parameters, headers and a body mapping make any REST call.
    pub http: Option<RawHttpExecutor>,
    /// Run a local program with the arguments as JSON on stdin.
    pub process: Option<RawProcessExecutor>,
    /// Hand the call to another agent over the Agent2Agent protocol (A2A 1.0, or 0.3 as its
    /// card says), reached through a configured upstream: the task's lifetime is the call's,
    /// and a call cancelled or past its deadline cancels the task.
    pub a2a: Option<RawA2aExecutor>,
}

/// An A2A tool: a message to the agent an upstream serves, its task's artifacts the output.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawA2aExecutor {
    /// The upstream's name in `upstreams`: the agent's origin, TLS, headers and credentials.
    pub upstream: String,
    /// Where the agent's card is, under the upstream (default /.well-known/agent-card.json).
    /// The endpoint it names must be on the upstream's origin.
    pub card_path: Option<String>,
    /// The string argument that is the message's text (default: the arguments as JSON text).
    pub message_argument: Option<String>,
}

/// An HTTP tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHttpExecutor {
    /// The upstream's name in `upstreams`.
    pub upstream: String,
    /// Path appended to the upstream's URL (default: none). `{name}` slots take the argument of
    /// that name, percent-encoded as one path segment.
    #[serde(default)]
    pub path: String,
    /// The request's method (default POST).
    pub method: Option<RawHttpMethod>,
    /// Query parameters, by name: each takes an argument (of the same name unless `argument`
    /// says otherwise).
    #[serde(default)]
    pub query: BTreeMap<String, RawQueryParam>,
    /// Headers set from arguments, by header name (non-secret values only: secrets belong in
    /// the upstream's `headers` or `credentials`).
    #[serde(default)]
    pub headers: BTreeMap<String, RawHeaderParam>,
    /// The body: `arguments` (the arguments not sent in the path, query or headers, as a JSON
    /// object; the default for POST, PUT and PATCH), `none` (the default for GET, HEAD and
    /// DELETE) or `{ argument: NAME }` (that argument's value as the JSON body).
    pub body: Option<RawHttpBody>,
    /// The statuses that mean success (default: any 2xx).
    pub success_statuses: Option<Vec<u16>>,
}

/// An HTTP method.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum RawHttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
    Head,
}

/// One query parameter.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawQueryParam {
    /// The argument that fills it (default: the parameter's name).
    pub argument: Option<String>,
    /// How arrays and objects are written (OpenAPI's styles; default form).
    pub style: Option<RawQueryStyle>,
    /// Arrays and objects as one parameter per item (default true for form, false otherwise).
    pub explode: Option<bool>,
}

/// OpenAPI's query styles.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawQueryStyle {
    /// `?id=1&id=2` (explode) or `?id=1,2`; objects `?a=1&b=2` or `?point=a,1,b,2`.
    Form,
    /// `?filter[status]=open&filter[team]=7`.
    DeepObject,
    /// `?id=1|2`.
    PipeDelimited,
    /// `?id=1%202`.
    SpaceDelimited,
}

/// A header set from an argument.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderParam {
    /// The argument that fills it (default: the header's name).
    pub argument: Option<String>,
}

/// What an HTTP tool's request body is: `arguments`, `none` or `{ argument: NAME }`.
#[derive(Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(untagged)]
pub enum RawHttpBody {
    Keyword(RawHttpBodyKeyword),
    /// One argument's value, as the JSON body.
    Argument(RawHttpBodyArgument),
}

/// `arguments` or `none`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawHttpBodyKeyword {
    /// The arguments not sent in the path, query or headers, as a JSON object.
    Arguments,
    /// No body.
    None,
}

/// One argument's value as the body.
#[derive(Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawHttpBodyArgument {
    pub argument: String,
}

/// A process tool. No shell is involved: `command` is run directly with `args`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProcessExecutor {
    /// The program (an absolute path, or a name looked up in the allowed PATH).
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables passed from the sidecar's own environment; all others are cleared.
    #[serde(default)]
    pub env: Vec<String>,
    /// Environment variables set for the program.
    #[serde(default)]
    pub set_env: BTreeMap<String, String>,
    /// Working directory (default: the catalog file's directory).
    pub working_dir: Option<String>,
    /// Most bytes of stderr kept for the error summary (default 2048).
    pub max_stderr_bytes: Option<usize>,
}
