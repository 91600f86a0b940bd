//! The rate limits' metrics, registered once by the boundary that builds each catalog's
//! [`Quotas`](super::Quotas): `toolgate_rate_limit_local_decisions_total`, the quotas this
//! sidecar decided alone while the shared state could not be reached.

use prometheus_client::metrics::counter::Counter;

use crate::metrics::Metrics;

/// See the module docs. Clones count in the same families.
#[derive(Clone, Debug)]
pub struct QuotaMetrics {
    local_decisions: Counter,
}

impl QuotaMetrics {
    /// The rate limits' families, registered in `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        QuotaMetrics {
            local_decisions: metrics.registered(
                "rate_limit_local_decisions",
                "Calls whose quota this sidecar decided alone because the shared state could not be reached (on_unavailable: local)",
            ),
        }
    }

    /// A quota decided by this sidecar alone during an outage of the shared state.
    pub fn local_decision(&self) {
        self.local_decisions.inc();
    }
}
