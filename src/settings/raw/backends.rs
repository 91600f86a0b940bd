//! The backends tools reach: HTTP upstreams and MCP servers, by name.

use super::*;

/// An HTTP upstream.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Base URL, e.g. `https://billing.internal:8443/api`; tool paths are appended.
    pub url: String,
    /// URL schemes this upstream may use, for its URL and any redirect (default `[https]`).
    pub allow_schemes: Option<Vec<String>>,
    /// Allow loopback, private, link-local and other non-public addresses (default false).
    /// Cloud metadata addresses stay refused unless `allow_private_cidrs` names one exactly.
    #[serde(default)]
    pub allow_private_addresses: bool,
    /// Static name resolution, like curl's --resolve: host -> addresses. Checked like DNS answers.
    #[serde(default)]
    pub resolve: BTreeMap<String, Vec<String>>,
    /// Headers sent on every request; values from secrets never reach the model or the audit log.
    #[serde(default)]
    pub headers: BTreeMap<String, RawHeaderValue>,
    /// Largest response body accepted, in bytes (default 1048576).
    pub max_response_bytes: Option<usize>,
    /// Most requests in flight to this upstream; beyond it calls are refused at once (default 64).
    pub max_concurrency: Option<usize>,
    /// Connection timeout (default 5s).
    pub connect_timeout: Option<String>,
    /// Non-public ranges this upstream may reach without `allow_private_addresses`, e.g.
    /// `["10.1.2.0/24"]`. Cloud metadata addresses stay refused unless an entry is exactly one.
    #[serde(default)]
    pub allow_private_cidrs: Vec<String>,
    /// How each call authenticates to this upstream: the caller's token exchanged for one of
    /// the upstream's (RFC 8693), the sidecar's own short-lived token, or the caller's token
    /// passed through where it is the upstream's (docs/executors.md).
    pub credentials: Option<RawCredentials>,
}

/// Per-call credentials for a backend. Exactly one of the three.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCredentials {
    /// RFC 8693 token exchange: the caller's verified token as `subject_token`.
    pub token_exchange: Option<RawTokenGrant>,
    /// The sidecar's own token from the client credentials grant, refreshed before it expires.
    pub client_credentials: Option<RawTokenGrant>,
    /// The caller's own token, only when its `aud` names `audience`.
    pub pass_through: Option<RawPassThrough>,
}

/// A grant at the operator's token endpoint.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTokenGrant {
    /// The token endpoint. `https`, or `http` on a loopback address.
    pub token_endpoint: String,
    pub client_id: String,
    /// File holding the client secret (client_secret_basic).
    pub client_secret_file: Option<String>,
    /// Or a PEM private key (RSA or P-256) signing a client assertion (private_key_jwt).
    pub client_key_file: Option<String>,
    /// The `kid` put in the client assertion's header.
    pub client_key_id: Option<String>,
    /// The `audience` parameter: the backend the token is for.
    pub audience: Option<String>,
    /// The `resource` parameter (RFC 8707).
    pub resource: Option<String>,
    /// The `scope` parameter.
    pub scope: Option<String>,
    /// Token exchange only: the sidecar's workload token (e.g. a projected service-account
    /// token), sent as `actor_token`, read at each exchange.
    pub actor_token_file: Option<String>,
    /// Each request to the token endpoint (default 5s).
    pub timeout: Option<String>,
}

/// The caller's token, passed on as it came.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPassThrough {
    /// The audience the caller's token must name (`aud`) to be passed on.
    pub audience: String,
}

/// A header value: a literal, or read from an environment variable or a file.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderValue {
    /// A literal value (not secret).
    pub value: Option<String>,
    /// Environment variable holding the value.
    pub env: Option<String>,
    /// File holding the value (trailing whitespace trimmed).
    pub file: Option<String>,
    /// Text put before the value, e.g. `"Bearer "`.
    pub prefix: Option<String>,
}

/// An MCP server.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMcpServer {
    /// Run a local server over stdio: the program and its arguments (no shell).
    pub command: Option<Vec<String>>,
    /// Or connect to a Streamable HTTP server at this URL.
    pub url: Option<String>,
    /// Environment variables passed to a stdio server from the sidecar's own (others are cleared).
    #[serde(default)]
    pub env: Vec<String>,
    /// Environment variables set for a stdio server.
    #[serde(default)]
    pub set_env: BTreeMap<String, String>,
    /// Tool names enter the catalog as `<prefix>.<tool>` (default: the server's name).
    pub prefix: Option<String>,
    /// How long connecting and listing tools may take (default 30s).
    pub startup_timeout: Option<String>,
    /// The server's tools that enter the catalog, with the catalog's settings for each. Tools the
    /// server offers that are not listed here are not exposed: a server's own description is
    /// never taken as authorization.
    pub tools: BTreeMap<String, RawMcpTool>,
    /// For `url`: allow loopback, private, link-local and other non-public addresses (default
    /// false). Cloud metadata addresses stay refused.
    #[serde(default)]
    pub allow_private_addresses: bool,
    /// For `url`: non-public ranges this server may be reached at, e.g. `["10.1.2.0/24"]`.
    #[serde(default)]
    pub allow_private_cidrs: Vec<String>,
    /// For `url`: static name resolution (host -> addresses), checked like DNS answers.
    #[serde(default)]
    pub resolve: BTreeMap<String, Vec<String>>,
    /// Largest single message accepted from the server, in bytes (default 4194304); a response
    /// over it ends its call as `output_too_large`.
    pub max_message_bytes: Option<usize>,
    /// What happens when a pinned tool's definition differs from its pin, for this server's
    /// tools (default withdraw).
    pub on_definition_change: Option<RawDefinitionChange>,
    /// For `url`: how each tool call authenticates, as for upstreams: the caller's token
    /// exchanged for one of the server's (RFC 8693), or the sidecar's own short-lived token. The
    /// session's own requests (initialize, tools/list) carry the sidecar's token from the same
    /// grant (docs/executors.md#credentials).
    pub credentials: Option<RawCredentials>,
}

/// What happens when the server lists a pinned tool with a definition other than its pin.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawDefinitionChange {
    /// Take the tool out of the catalog: not listed, calls answer UNAVAILABLE
    /// (`definition_changed`) until the pin or the server's definition is put right.
    #[default]
    Withdraw,
    /// Keep serving the tool with the server's new definition, with a warning.
    Warn,
}

/// Catalog-side settings of one MCP tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMcpTool {
    /// What the tool can change.
    pub risk_level: RawRiskLevel,
    /// Overrides the server's description.
    pub description: Option<String>,
    /// Scopes the caller needs.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// Execution timeout (default 30s).
    pub timeout: Option<String>,
    /// Per-tenant rate limit.
    pub rate_limit: Option<RawRateLimit>,
    /// Server-bound arguments, as for other tools.
    #[serde(default)]
    pub bind: BTreeMap<String, serde_json::Value>,
    /// What to do when the model sends a bound argument (default deny).
    #[serde(default)]
    pub on_bound_argument: RawBoundOverride,
    /// Override whether the tool needs approval.
    pub requires_approval: Option<bool>,
    /// When a tool that can need approval needs it, as for other tools.
    pub approval: Option<RawToolApproval>,
    /// Largest output returned, in bytes.
    pub max_output_bytes: Option<usize>,
    /// Most calls in flight at once.
    pub max_concurrency: Option<usize>,
    /// Free-form labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// This tool's output guard, over the catalog's, as for other tools.
    pub output_guard: Option<RawOutputGuard>,
    /// The flow labels this tool carries, as for other tools.
    #[serde(default)]
    pub flow_labels: Vec<String>,
    /// The definition reviewed: `sha256:` and the hex SHA-256 of the canonical form of the
    /// tool's name, description, input schema, output schema and annotations as the server lists
    /// them (`toolgate pin` prints it). A server that lists anything else is not trusted.
    pub pin: Option<String>,
    /// Overrides the server's `on_definition_change` for this tool.
    pub on_definition_change: Option<RawDefinitionChange>,
}
