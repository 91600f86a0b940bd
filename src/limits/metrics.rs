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
        let quotas = QuotaMetrics {
            local_decisions: Counter::default(),
        };
        metrics.register(
            "rate_limit_local_decisions",
            "Calls whose quota this sidecar decided alone because the shared state could not be reached (on_unavailable: local)",
            quotas.local_decisions.clone(),
        );
        quotas
    }

    /// A quota decided by this sidecar alone during an outage of the shared state.
    pub fn local_decision(&self) {
        self.local_decisions.inc();
    }
}
