//! The catalog file exactly as written: serde structs that refuse unknown fields. Nothing here is
//! validated beyond its shape; `config::load` turns these into typed values.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

/// A toolgate catalog file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Format version of this file; must be 1.
    pub version: u32,
    /// Listen addresses and shutdown behaviour.
    #[serde(default)]
    pub server: RawServer,
    /// How callers are identified.
    #[serde(default)]
    pub identity: RawIdentity,
    /// Request size limits and concurrency caps.
    #[serde(default)]
    pub limits: RawLimits,
    /// Which calls need an approval and how long approvals live.
    #[serde(default)]
    pub approvals: RawApprovals,
    /// Where audit events go.
    #[serde(default)]
    pub audit: RawAudit,
    /// Where rate limits, approvals and idempotency results live: this sidecar's memory (the
    /// default) or a Redis shared by every replica. Changes take effect on restart.
    pub state: Option<RawState>,
    /// Allow/deny lists applied to every caller.
    #[serde(default)]
    pub policy: RawAccessList,
    /// The tenants that may call; a tenant not listed here is refused.
    #[serde(default)]
    pub tenants: BTreeMap<String, RawTenant>,
    /// Agents whose tool lists are narrowed further, by exact (case-sensitive) name. Once any
    /// agent is listed, a caller whose agent is not listed — including a caller that names no
    /// agent — gets the `"*"` entry, or nothing at all when there is no `"*"` entry.
    #[serde(default)]
    pub agents: BTreeMap<String, RawAccessList>,
    /// HTTP upstreams that `http` tools call, by name. The model never supplies a URL.
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    /// MCP servers whose tools enter the catalog, by name.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, RawMcpServer>,
    /// Trace export; the standard OTEL_* environment variables fill in what is not set here.
    pub telemetry: Option<RawTelemetry>,
    /// What tool output may carry back to the model: the catalog's detectors (secrets,
    /// personal data, its own patterns) and what each does. Without it, every secret detector
    /// redacts. A tool's own `output_guard` overrides it.
    pub output_guard: Option<RawOutputGuard>,
    /// Run-level information-flow rules: which labels the tools that ran in a run (or for a
    /// caller, over a window) carried, and which tools may not run, or need approval, after
    /// them (e.g. no `external_send` after `private_data` and `untrusted_content`).
    pub flow: Option<RawFlow>,
    /// The tools, one entry per (name, version).
    #[serde(default)]
    pub tools: Vec<RawTool>,
    /// A candidate catalog file (relative to this one) that every call is also explained
    /// against, off the response path: decisions that differ are audited as `shadow_decision`
    /// events. Reloaded like this file; a broken candidate is refused without affecting this
    /// catalog. A candidate's own `shadow_catalog` is ignored.
    pub shadow_catalog: Option<String>,
}

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

/// Listen addresses and shutdown behaviour.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// TCP address to serve gRPC on (default 127.0.0.1:50051); an empty string disables TCP.
    pub listen: Option<String>,
    /// Optional Unix domain socket path to serve gRPC on as well.
    pub unix_socket: Option<String>,
    /// How long in-flight calls may take to finish after SIGTERM (default 10s).
    pub shutdown_grace: Option<String>,
    /// How often the catalog file is checked for changes (default 5s). SIGHUP reloads at once.
    pub reload_interval: Option<String>,
    /// HTTP address for /metrics, /healthz and /readyz (default: off).
    pub admin_listen: Option<String>,
    /// The MCP door: the same tools, served to MCP hosts over Streamable HTTP (default: off).
    pub mcp: Option<RawMcpDoor>,
}

/// The MCP door (MCP's Streamable HTTP transport), an OAuth 2.1 resource server.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMcpDoor {
    /// TCP address to serve MCP on (default 127.0.0.1:8765).
    pub listen: Option<String>,
    /// The path of the MCP endpoint (default /mcp).
    pub path: Option<String>,
    /// This resource's canonical URI (RFC 8707, RFC 9728): the audience the door's tokens must
    /// name. Required with identity.jwt on a non-loopback address; otherwise http://{listen}{path}.
    pub resource: Option<String>,
    /// Authorization servers named in /.well-known/oauth-protected-resource.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// Scopes named in the protected-resource metadata (default: required_scopes).
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    /// Scopes every request to the door needs; a token without them gets 403 insufficient_scope.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// Host header values accepted (DNS-rebinding protection; default: localhost, 127.0.0.1, ::1).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Origin header values accepted, with scheme (e.g. https://app.example.com:443); a request
    /// with any other Origin gets 403 (default: none accepted).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// The deadline of a request that does not carry one (default 60s); a call is also bounded by
    /// its tool's timeout.
    pub request_timeout: Option<String>,
    /// Where a person decides an approval, shown to MCP hosts; `{approval_id}` is replaced.
    pub approvals_url: Option<String>,
    /// File holding the key (at least 32 bytes) that seals approval request state; default: a
    /// random key per process (a retry must then reach the same replica).
    pub request_state_key_file: Option<String>,
    /// Environment variable holding that key.
    pub request_state_key_env: Option<String>,
}

/// How callers are identified.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    /// Trust the unauthenticated x-toolgate-* metadata headers. For development only; cannot be
    /// combined with `jwt`, and refused on a non-loopback TCP listener unless
    /// `allow_unauthenticated_network_callers` is set.
    #[serde(default)]
    pub dev_identity: bool,
    /// DANGEROUS: with dev identity, also accept callers on a non-loopback TCP listener, so
    /// anyone who can reach the port can claim any tenant, subject and scopes.
    #[serde(default)]
    pub allow_unauthenticated_network_callers: bool,
    /// Verify `authorization: Bearer <JWT>`.
    pub jwt: Option<RawJwt>,
    /// Tenants whose admins (scope `toolgate:admin`) are the platform's operators: in the
    /// Controls service they set, list and clear emergency denies on every tenant and for every
    /// tenant. Any other tenant's admin acts on its own tenant's denies only. Name tenants no
    /// customer can be given.
    #[serde(default)]
    pub platform_tenants: Vec<String>,
}

/// JWT verification settings. Exactly one key source is required.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    /// File holding the HS256 shared secret (relative paths are relative to this file).
    pub hs256_secret_file: Option<String>,
    /// Environment variable holding the HS256 shared secret.
    pub hs256_secret_env: Option<String>,
    /// PEM public keys (RSA for RS256, P-256 for ES256).
    #[serde(default)]
    pub public_key_files: Vec<String>,
    /// A JWKS file of public keys, selected by `kid`.
    pub jwks_file: Option<String>,
    /// Required `iss` value(s).
    #[serde(default)]
    pub issuer: Vec<String>,
    /// Required `aud` value(s).
    #[serde(default)]
    pub audience: Vec<String>,
    /// Clock skew tolerated for `exp` and `nbf` (default 30s).
    pub leeway: Option<String>,
    /// Which claims carry the caller's identity.
    #[serde(default)]
    pub claims: RawClaims,
}

/// Claim names mapped to the caller's identity.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawClaims {
    /// Claim holding the tenant (default `tenant`); required in every token.
    pub tenant: Option<String>,
    /// Claim holding the subject (default `sub`).
    pub subject: Option<String>,
    /// Claim holding the agent (default `agent`).
    pub agent: Option<String>,
    /// Claim holding scopes, space separated or an array (default `scope`).
    pub scopes: Option<String>,
    /// Further claims that conditions may read as `caller.claims.<name>`: only these (none
    /// unless listed), and only from a verified token (docs/conditions.md).
    #[serde(default)]
    pub expose: Vec<String>,
}

/// Request size limits and concurrency caps.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Largest `arguments_json` accepted, in bytes (default 1048576).
    pub max_arguments_bytes: Option<usize>,
    /// Deepest nesting of arrays and objects accepted in arguments (default 64).
    pub max_arguments_depth: Option<usize>,
    /// Most JSON values accepted in one call's arguments, counted before parsing: each costs
    /// about 72 bytes parsed (default 100000, about 7 MiB).
    pub max_arguments_values: Option<usize>,
    /// Largest tool output returned, in bytes, unless a tool sets its own (default 1048576).
    pub max_output_bytes: Option<usize>,
    /// Most calls of one ExecuteTools request run at once (default 8).
    pub max_parallel: Option<usize>,
    /// Most calls accepted in one ExecuteTools request (default 128).
    pub max_batch_calls: Option<usize>,
    /// How long an idempotency key's result is kept (default 10m).
    pub idempotency_window: Option<String>,
    /// Most idempotency keys kept per tenant; the tenant's oldest finished ones go first
    /// (default 1000).
    pub idempotency_max_entries_per_tenant: Option<usize>,
    /// Bytes of idempotency results kept per tenant (default 8388608, 8 MiB).
    pub idempotency_max_bytes_per_tenant: Option<usize>,
    /// Bytes of idempotency results kept in total (default 33554432, 32 MiB).
    pub idempotency_max_bytes: Option<usize>,
    /// Largest gRPC message accepted or sent, in bytes (default 4194304).
    pub max_message_bytes: Option<usize>,
    /// Longest call_id, run_id, idempotency_key, approval_id and tool name accepted, in bytes;
    /// they must also be printable ASCII (default 256).
    pub max_identifier_bytes: Option<usize>,
    /// Longest tenant, subject or agent accepted from metadata or token claims, in bytes; the
    /// scopes may be 16 times as long (default 256).
    pub max_identity_bytes: Option<usize>,
    /// ToolGate and Approvals RPCs in flight in the whole sidecar; beyond it calls get
    /// RESOURCE_EXHAUSTED at once (default 1024).
    pub max_in_flight: Option<usize>,
    /// Bytes of requests the sidecar holds at once (read and not yet answered); beyond it calls
    /// get RESOURCE_EXHAUSTED at once. At least max_message_bytes (default 33554432, 32 MiB).
    pub max_request_bytes_in_flight: Option<usize>,
    /// HTTP/2 streams one client connection may have open at once (default 256).
    pub max_streams_per_connection: Option<usize>,
    /// ToolGate and Approvals RPCs one tenant may have in flight, so that no tenant takes the
    /// whole of max_in_flight (default 256, or max_in_flight if smaller).
    pub max_in_flight_per_tenant: Option<usize>,
    /// Of max_in_flight, the RPCs only the Unix socket (the agent in the pod) may use: TCP
    /// callers get the rest (default 64, or a quarter of max_in_flight if smaller; 0 for none).
    pub in_flight_reserved_for_unix_socket: Option<usize>,
    /// Connections each listener (TCP, Unix socket) holds at once; beyond it a new connection
    /// is closed at once (default 512).
    pub max_connections_per_listener: Option<usize>,
    /// How long a new connection has to send the HTTP/2 preface and its first frame before it
    /// is closed (default 5s).
    pub handshake_timeout: Option<String>,
    /// How long a request's body may take to arrive once its headers have; then the RPC is
    /// refused with DEADLINE_EXCEEDED and its slot freed (default 10s).
    pub request_body_timeout: Option<String>,
    /// A connection that carries no ToolGate or Approvals RPC for this long is closed; clients
    /// reconnect on their next call (default 2m).
    pub idle_connection_timeout: Option<String>,
    /// Bytes of parsed arguments the calls in flight may hold, estimated before parsing as the
    /// text plus 80 bytes per JSON value; beyond it a call is refused UNAVAILABLE/overloaded
    /// (default 67108864, 64 MiB).
    pub max_parsed_arguments_bytes_in_flight: Option<usize>,
    /// Bytes of recently listed catalog revisions remembered for `catalog_revision` checks
    /// (default 8388608, 8 MiB).
    pub revision_log_max_bytes: Option<usize>,
    /// Bytes of verified JWTs remembered (default 4194304, 4 MiB).
    pub token_cache_max_bytes: Option<usize>,
}

/// Which calls need an approval and how long approvals live.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawApprovals {
    /// Risk levels that need approval (default write_confirmed and destructive).
    pub risk_levels: Option<Vec<RawRiskLevel>>,
    /// How long an approval stays valid after it is requested (default 5m).
    pub ttl: Option<String>,
    /// Most approvals kept per tenant; the oldest finished ones are forgotten first (default 1000).
    pub max_per_tenant: Option<usize>,
    /// Bytes of approvals kept per tenant (default 4194304, 4 MiB).
    pub max_bytes_per_tenant: Option<usize>,
    /// Bytes of approvals kept in total (default 16777216, 16 MiB).
    pub max_bytes: Option<usize>,
}

/// Where audit events go.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    /// `stdout` (default), `file`, `otlp` (OTLP logs over gRPC) or `none`.
    pub sink: Option<RawAuditSink>,
    /// File path for the `file` sink (appended to).
    pub path: Option<String>,
    /// OTLP/gRPC endpoint for the `otlp` sink (default: the traces endpoint, if that is gRPC).
    pub endpoint: Option<String>,
    /// Events held in memory before callers wait: queued for the sink, or reserved by calls in
    /// flight (each call takes its slot before it runs, so this also bounds calls in flight; keep
    /// it above limits.max_in_flight × limits.max_parallel) (default 16384).
    pub queue_capacity: Option<usize>,
    /// Most `authentication_failed` events written, e.g. `10/s` or `{quota: 10/s, burst: 100}`
    /// (the default); refused callers beyond it are counted, not written.
    pub authentication_failures: Option<RawRateLimit>,
    /// When the queue is full: `wait` (default; calls wait for room) or `refuse` (fail closed:
    /// new calls are refused with UNAVAILABLE rather than run unaudited).
    pub when_full: Option<RawAuditWhenFull>,
    /// For the file sink: `never` (default; the OS decides), `batch` (after each write batch)
    /// or `always` (after every event).
    pub fsync: Option<RawFsync>,
}

/// Where rate limits, approvals and idempotency results live.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawState {
    /// `memory` (default): this sidecar's own memory, lost on restart and not shared. `redis`: a
    /// Redis (or Valkey) shared by every sidecar that uses the same `redis.url` and
    /// `redis.key_prefix`, so quotas, approvals and idempotency keys hold across replicas and
    /// restarts.
    pub backend: Option<RawStateBackend>,
    /// How to reach Redis (backend `redis` only).
    pub redis: Option<RawRedis>,
    /// What each concern does while the backend cannot be reached.
    #[serde(default)]
    pub on_unavailable: RawOnUnavailable,
    /// Report the sidecar not ready (/readyz 503, gRPC health NOT_SERVING) while the backend
    /// cannot be reached (default false: calls that need it are refused with a retryable
    /// `state_unavailable`, the others keep working).
    #[serde(default)]
    pub unready_when_unavailable: bool,
}

/// A state backend.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawStateBackend {
    Memory,
    Redis,
}

/// How to reach Redis.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    /// `redis://host:port/db` or `rediss://host:port/db` (TLS). No credentials in the URL: use
    /// `username` and `password_env` or `password_file`.
    pub url: String,
    /// ACL user name (default: none, the `default` user).
    pub username: Option<String>,
    /// Environment variable holding the password.
    pub password_env: Option<String>,
    /// File holding the password (trailing whitespace trimmed).
    pub password_file: Option<String>,
    /// With `rediss://`: the CA certificates (PEM) Redis's certificate must chain to, instead of
    /// the system's roots.
    pub ca_file: Option<String>,
    /// Put before every key, so several deployments can share one Redis (default `toolgate:`).
    /// Printable ASCII without `{` or `}`, at most 64 bytes.
    pub key_prefix: Option<String>,
    /// How long one Redis operation may take before it counts as an outage (default 50ms).
    pub timeout: Option<String>,
    /// How long connecting may take (default 1s).
    pub connect_timeout: Option<String>,
    /// Multiplexed connections shared by all calls, 1-16 (default 1; one carries tens of
    /// thousands of operations a second).
    pub connections: Option<usize>,
    /// `url` is one node of a Redis Cluster (default false): the other nodes and the slots are
    /// discovered from it, and each operation goes to the node holding its tenant's slot.
    #[serde(default)]
    pub cluster: bool,
}

/// What each concern does while the state backend cannot be reached.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOnUnavailable {
    /// `fail_closed` (default): calls with a quota are refused (`UNAVAILABLE`,
    /// `state_unavailable`, retryable). `local`: this sidecar's own in-memory limiter decides
    /// meanwhile (each replica then admits up to the full quota), with a warning and a metric.
    pub rate_limits: Option<RawRateLimitOutage>,
    /// Always `fail_closed`: an approval is never checked or used without the shared record.
    pub approvals: Option<RawFailClosed>,
    /// Always `fail_closed`: a keyed call never runs without its claim.
    pub idempotency: Option<RawFailClosed>,
}

/// What rate limits do while the state backend cannot be reached.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawRateLimitOutage {
    FailClosed,
    Local,
}

/// The only outage behaviour of a concern that must not be decided locally.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawFailClosed {
    FailClosed,
}

/// What to do when the audit queue is full.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawAuditWhenFull {
    Wait,
    Refuse,
}

/// When the audit file is synced to disk.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawFsync {
    Never,
    Batch,
    Always,
}

/// An audit sink.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawAuditSink {
    Stdout,
    File,
    /// OTLP logs over gRPC.
    Otlp,
    None,
}

/// Allow and deny lists of tool-name globs (e.g. `ticket_*`), each entry optionally with a
/// condition. Deny wins.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAccessList {
    /// If set, only tools matching one of these entries.
    pub allow: Option<Vec<RawRule>>,
    /// Never tools matching one of these entries.
    #[serde(default)]
    pub deny: Vec<RawRule>,
}

/// When a tool's calls need approval.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawToolApproval {
    /// A CEL expression over `caller`, `tool`, `args`, `now` and `run`: a call needs approval
    /// only when it is true (or cannot be evaluated). Without it, every call does.
    pub when: String,
}

/// An allow or deny entry: a tool-name glob, or globs with a CEL condition
/// (`{ tools: [send_email], when: "!args.to.endsWith('@acme.com')" }`).
#[derive(Debug, Clone, JsonSchema)]
#[serde(untagged)]
pub enum RawRule {
    /// A tool-name glob, e.g. `ticket_*`.
    Glob(String),
    /// Globs the rule applies to only when its condition holds.
    Conditional(RawConditionalRule),
}

/// Globs with a condition.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConditionalRule {
    /// Tool-name globs, e.g. `[send_email]`.
    pub tools: Vec<String>,
    /// A CEL expression over `caller`, `tool`, `args`, `now` and `run`; the rule applies only
    /// when it is true.
    pub when: String,
}

// By hand rather than `untagged`: a mistyped object entry gets its own error (an unknown field,
// a missing `when`) instead of "did not match any variant".
impl<'de> Deserialize<'de> for RawRule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = RawRule;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a tool-name glob, or { tools: [globs], when: \"condition\" }")
            }
            fn visit_str<E: serde::de::Error>(self, glob: &str) -> Result<RawRule, E> {
                Ok(RawRule::Glob(glob.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawRule, A::Error> {
                RawConditionalRule::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawRule::Conditional)
            }
        }
        deserializer.deserialize_any(Entry)
    }
}

/// One tenant's policy.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    /// If set, only tools matching one of these entries.
    pub allow: Option<Vec<RawRule>>,
    /// Never tools matching one of these entries.
    #[serde(default)]
    pub deny: Vec<RawRule>,
    /// Overall rate limit for the tenant across all tools, e.g. `1000/min`.
    pub rate_limit: Option<RawRateLimit>,
}

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
}

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

/// An output guard: which detectors screen a tool's output, and what each does.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOutputGuard {
    /// What every secret detector does (aws_access_key, github_token, gitlab_token,
    /// slack_token, private_key, jwt, authorization_header, connection_string_password):
    /// redact, block or off. Unset in a tool's section, the catalog's applies; unset in both,
    /// they redact.
    pub secrets: Option<RawGuardAction>,
    /// One built-in detector's action, over `secrets`; the personal-data detectors (email,
    /// payment_card, iban, phone) are off unless named here.
    #[serde(default)]
    pub detectors: BTreeMap<String, RawGuardAction>,
    /// The catalog's own detectors: a name and a regex.
    #[serde(default)]
    pub custom: Vec<RawCustomDetector>,
}

/// What a detector does with what it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawGuardAction {
    /// Replace each match with `[REDACTED:<detector>]`.
    Redact,
    /// Withhold the whole output: the call ends `output_blocked`.
    Block,
    /// Do not look.
    Off,
}

/// A detector of the catalog's own.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCustomDetector {
    /// Its name, as redactions, audit events and metrics show it: lower-case letters, digits
    /// and '_'.
    pub name: String,
    /// A regex (Rust `regex` syntax: no look-around or backreferences, linear time). A group
    /// named `secret` (`(?P<secret>...)`) marks the part of a match that is redacted.
    pub pattern: String,
    /// What it does with a match (default redact).
    #[serde(default = "redact")]
    pub action: RawGuardAction,
}

fn redact() -> RawGuardAction {
    RawGuardAction::Redact
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
    /// POST the arguments as JSON to a configured upstream.
    pub http: Option<RawHttpExecutor>,
    /// Run a local program with the arguments as JSON on stdin.
    pub process: Option<RawProcessExecutor>,
}

/// An HTTP tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHttpExecutor {
    /// The upstream's name in `upstreams`.
    pub upstream: String,
    /// Path appended to the upstream's URL (default: none).
    #[serde(default)]
    pub path: String,
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

/// Trace export settings. Unset fields come from the standard `OTEL_*` environment variables.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// OTLP endpoint, e.g. `http://localhost:4317` (gRPC) or `http://localhost:4318/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// `grpc` (default) or `http/protobuf`.
    pub otlp_protocol: Option<String>,
    /// `service.name` (default `toolgate`).
    pub service_name: Option<String>,
    /// `always_on`, `always_off`, `traceidratio`, `parentbased_always_on` (default),
    /// `parentbased_always_off` or `parentbased_traceidratio`.
    pub sampler: Option<String>,
    /// The ratio for the ratio samplers.
    pub sampler_arg: Option<f64>,
    /// How long finished spans wait before a batch is sent (default 100ms; OTEL_BSP_SCHEDULE_DELAY).
    pub batch_delay: Option<String>,
}

impl RawConfig {
    /// The files this catalog reads besides itself (JWT keys, header values), relative paths
    /// resolved against `base_dir`. Reloads watch them: Kubernetes updates a Secret and a
    /// ConfigMap at different times.
    pub fn referenced_files(&self, base_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        if let Some(jwt) = &self.identity.jwt {
            files.extend(jwt.hs256_secret_file.iter().cloned());
            files.extend(jwt.public_key_files.iter().cloned());
            files.extend(jwt.jwks_file.iter().cloned());
        }
        for upstream in self.upstreams.values() {
            files.extend(upstream.headers.values().filter_map(|h| h.file.clone()));
        }
        let mut files: Vec<_> = files
            .iter()
            .map(|f| super::resolve_path(base_dir, f))
            .collect();
        files.sort();
        files.dedup();
        files
    }
}
