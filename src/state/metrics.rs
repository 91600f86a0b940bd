//! The shared state's metrics, registered when the backend starts (memory too, so the page
//! reads the same whichever backend serves): `toolgate_state_backend_up` and
//! `toolgate_state_failures_total{concern}`.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};

use crate::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConcernLabels {
    concern: String,
}

/// See the module docs. Clones count in the same families.
#[derive(Clone, Debug)]
pub struct StateMetrics {
    up: Gauge,
    failures: Family<ConcernLabels, Counter>,
}

impl StateMetrics {
    /// The state backend's families, registered in `metrics`; the backend is up until it says
    /// otherwise (memory always is).
    pub fn register(metrics: &Metrics) -> Self {
        let state = StateMetrics {
            up: metrics.registered(
                "state_backend_up",
                "1 while the state backend (memory, or the shared Redis) answers",
            ),
            failures: metrics.registered(
                "state_failures",
                "Operations on the shared state that failed (timeout, unreachable, refused), by concern",
            ),
        };
        state.up.set(1);
        state
    }

    /// Whether the state backend answers.
    pub fn backend_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }

    /// An operation on the shared state failed; `concern` is one of a fixed few names.
    pub fn failure(&self, concern: &str) {
        self.failures
            .get_or_create(&ConcernLabels {
                concern: concern.to_owned(),
            })
            .inc();
    }
}
