//! Where rate limits, approvals and idempotency results live: this sidecar's memory (the
//! default), or a Redis shared by every replica ([`redis`]).
//!
//! Each concern keeps both implementations behind one enum in its own module, in one pattern:
//! `enum X { Memory(..), Shared(..) }`, made for a [`Backend`] by `X::on(&backend, ..)`
//! (`approvals::Approvals`, `boundary::idempotency::Idempotency`, `flow::FlowStore`,
//! `emergency::EmergencyDenies`' store; `limits::Quotas` per catalog by `Quotas::build`), each
//! method one `match` whose memory arm is a direct call with nothing boxed (a shared arm the
//! chain awaits boxes its future), so the boundary's chain reads the same for both. This module holds what the Redis implementations share: the connections, the
//! per-operation timeout, reachability, key names and the error type, and the backend's
//! metrics ([`metrics`]).

pub mod metrics;
pub mod redis;

use std::sync::Arc;

use self::metrics::StateMetrics;
pub use self::redis::{Redis, StateError};
use crate::{
    metrics::Metrics,
    settings::{StateBackend, StateConfig},
};

/// The state backend of a running sidecar.
#[derive(Clone, Debug)]
pub enum Backend {
    /// This sidecar's memory.
    Memory,
    /// A Redis shared with other sidecars.
    Redis(Arc<Redis>),
}

impl Backend {
    /// The backend `config` names, its metrics registered in `metrics`. Redis is connected
    /// lazily: start-up never waits for it, and until it answers, calls that need it get the
    /// configured outage behaviour.
    pub fn start(config: &StateConfig, metrics: &Metrics) -> Result<Backend, StateError> {
        let metrics = StateMetrics::register(metrics);
        match &config.backend {
            StateBackend::Memory => Ok(Backend::Memory),
            StateBackend::Redis(redis) => Ok(Backend::Redis(Arc::new(Redis::connect(
                redis, config, metrics,
            )?))),
        }
    }

    /// The shared Redis, if that is the backend.
    pub fn redis(&self) -> Option<&Arc<Redis>> {
        match self {
            Backend::Memory => None,
            Backend::Redis(redis) => Some(redis),
        }
    }

    /// Whether the backend answered its last operation or health check (memory always does).
    pub fn reachable(&self) -> bool {
        self.redis().is_none_or(|redis| redis.reachable())
    }
}

/// What an operation on the shared state is for: a metric label and a log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concern {
    RateLimits,
    Approvals,
    Idempotency,
    EmergencyDenies,
    Flow,
    Health,
}

impl Concern {
    pub fn as_str(self) -> &'static str {
        match self {
            Concern::RateLimits => "rate_limits",
            Concern::Approvals => "approvals",
            Concern::Idempotency => "idempotency",
            Concern::EmergencyDenies => "emergency_denies",
            Concern::Flow => "flow",
            Concern::Health => "health",
        }
    }
}
