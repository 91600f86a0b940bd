//! Where rate limits, approvals and idempotency results live, and what each does in an outage.

use super::*;

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
