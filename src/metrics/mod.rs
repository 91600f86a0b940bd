//! The Prometheus registry (prometheus-client) that every concern registers its own families in
//! through [`Metrics::registered`], when it is built: the boundary's calls and served revision
//! (`boundary::metrics`), quotas (`limits::metrics`), the shared state (`state::metrics`), the
//! catalog updates and listeners (`server`), the shadow catalog, and the gauges the admin door
//! reads when scraped (`app::admin`, which also serves them). Nothing here knows a family.
//!
//! Label cardinality is bounded by the catalog: the `tool` label is a catalog tool name, or
//! [`UNKNOWN_TOOL`] for names the model made up; tenants, subjects and call ids are never labels
//! (use traces and the audit log for per-tenant views).

use std::sync::Mutex;

use prometheus_client::{
    encoding::text::encode,
    registry::{Metric, Registry},
};

/// The `tool` label of calls to tools not in the catalog.
pub const UNKNOWN_TOOL: &str = "(unknown)";

/// The registry of all of toolgate's metrics, each named `toolgate_<name>`.
pub struct Metrics {
    /// Behind a lock so that each concern can register its own families at start.
    registry: Mutex<Registry>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Metrics {
            registry: Mutex::new(Registry::with_prefix("toolgate")),
        }
    }

    /// Registers a concern's metric family under `toolgate_<name>`: each concern owns its
    /// families and registers them when it is built. Families are rendered in the order they
    /// were registered.
    fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(name, help, metric);
    }

    /// A new metric (a counter, a gauge, a family of either) registered under
    /// `toolgate_<name>`: what a concern's struct of families is built from, one field each.
    pub fn registered<M: Metric + Clone + Default>(&self, name: &str, help: &str) -> M {
        self.registered_with(name, help, M::default())
    }

    /// `metric` registered under `toolgate_<name>` (one made otherwise than by `Default`, e.g. a
    /// histogram family with its buckets), and returned.
    pub fn registered_with<M: Metric + Clone>(&self, name: &str, help: &str, metric: M) -> M {
        self.register(name, help, metric.clone());
        metric
    }

    /// Prometheus text exposition of every family registered.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = encode(&mut text, &registry) {
            tracing::error!(error = %err, "cannot encode metrics");
        }
        text
    }
}
