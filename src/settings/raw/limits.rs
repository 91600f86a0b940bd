//! Request size limits, concurrency caps, and how long approvals live.

use super::*;

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
