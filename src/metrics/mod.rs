//! The Prometheus registry (prometheus-client) and the metrics of calls, catalog reloads and the
//! state backend. Other concerns register their own families through [`Metrics::register`] (the
//! shadow catalog, the listeners); the admin door serving them is `server::admin`.
//!
//! Label cardinality is bounded by the catalog: the `tool` label is a catalog tool name, or
//! `(unknown)` for names the model made up; tenants, subjects and call ids are never labels (use
//! traces and the audit log for per-tenant views).

use std::sync::{Arc, Mutex};

use crate::{error::Status, outcome::CallOutcome};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: Arc<str>,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    stage: &'static str,
    error_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConcernLabels {
    concern: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RevisionLabels {
    revision: String,
}

/// The label for tools not in the catalog.
pub const UNKNOWN_TOOL: &str = "(unknown)";

fn duration_histogram() -> Histogram {
    // 0.5 ms to ~33 s.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 17,
    ))
}

/// Values read from elsewhere when scraped.
#[derive(Debug, Default, Clone, Copy)]
pub struct Snapshot {
    pub approvals_pending: i64,
    pub audit_queue_depth: i64,
    pub audit_written: i64,
    pub audit_dropped: i64,
    pub audit_write_errors: i64,
    pub audit_refused_callers_suppressed: i64,
    pub spans_dropped: i64,
    pub spans_export_failed: i64,
    pub idempotency_bytes: i64,
    pub approvals_bytes: i64,
    pub revision_log_bytes: i64,
    pub token_cache_bytes: i64,
    pub restart_required: bool,
}

/// Gauges filled from a [`Snapshot`] when scraped.
struct SnapshotGauges {
    audit_write_errors: Gauge,
    audit_refused_callers_suppressed: Gauge,
    spans_dropped: Gauge,
    spans_export_failed: Gauge,
    idempotency_bytes: Gauge,
    approvals_bytes: Gauge,
    revision_log_bytes: Gauge,
    token_cache_bytes: Gauge,
    restart_required: Gauge,
}

impl SnapshotGauges {
    fn register(registry: &mut Registry) -> Self {
        let mut gauge = |name: &str, help: &str| {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        SnapshotGauges {
            audit_write_errors: gauge(
                "audit_write_errors",
                "Failed writes to the audit sink since start (each retried until it succeeds)",
            ),
            audit_refused_callers_suppressed: gauge(
                "audit_refused_callers_suppressed",
                "Refused callers (UNAUTHENTICATED) not written to the audit log, over its rate bound",
            ),
            spans_dropped: gauge(
                "spans_dropped",
                "Spans not exported since start: dropped with the export queue full (should stay 0)",
            ),
            spans_export_failed: gauge(
                "spans_export_failed",
                "Spans not exported since start: sent in an export request that failed",
            ),
            idempotency_bytes: gauge(
                "idempotency_bytes",
                "Bytes held by idempotency keys and stored results",
            ),
            approvals_bytes: gauge("approvals_bytes", "Bytes held by approvals"),
            revision_log_bytes: gauge(
                "revision_log_bytes",
                "Bytes held by recently listed catalog revisions",
            ),
            token_cache_bytes: gauge("token_cache_bytes", "Bytes held by verified JWTs"),
            restart_required: gauge(
                "config_restart_required",
                "1 when the catalog file changed settings that only take effect on restart",
            ),
        }
    }

    fn set(&self, snapshot: &Snapshot) {
        self.audit_write_errors.set(snapshot.audit_write_errors);
        self.audit_refused_callers_suppressed
            .set(snapshot.audit_refused_callers_suppressed);
        self.spans_dropped.set(snapshot.spans_dropped);
        self.spans_export_failed.set(snapshot.spans_export_failed);
        self.idempotency_bytes.set(snapshot.idempotency_bytes);
        self.approvals_bytes.set(snapshot.approvals_bytes);
        self.revision_log_bytes.set(snapshot.revision_log_bytes);
        self.token_cache_bytes.set(snapshot.token_cache_bytes);
        self.restart_required
            .set(i64::from(snapshot.restart_required));
    }
}

/// All of toolgate's metrics.
pub struct Metrics {
    /// Behind a lock so that each concern can register its own families at start.
    registry: Mutex<Registry>,
    calls: Family<CallLabels, Counter>,
    durations: Family<ToolLabels, Histogram, fn() -> Histogram>,
    refusals: Family<RefusalLabels, Counter>,
    rate_limited: Family<ToolLabels, Counter>,
    in_flight: Gauge,
    approvals_pending: Gauge,
    audit_queue_depth: Gauge,
    audit_written: Gauge,
    audit_dropped: Gauge,
    /// Gauges read from a [`Snapshot`] at each scrape, by field.
    snapshot_gauges: SnapshotGauges,
    reloads: Family<ReloadLabels, Counter>,
    catalog_polls: Counter,
    catalog_parses: Counter,
    revision: Family<RevisionLabels, Gauge>,
    current_revision: Mutex<String>,
    state_up: Gauge,
    state_failures: Family<ConcernLabels, Counter>,
    rate_limit_local: Counter,
    /// The label of calls to tools the catalog does not have, made once.
    unknown_tool: Arc<str>,
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
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("toolgate");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls by tool and final status",
            calls.clone(),
        );
        let durations = Family::<ToolLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram,
        );
        registry.register(
            "tool_call_duration_seconds",
            "Time a call spent in the sidecar",
            durations.clone(),
        );
        let refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "refusals",
            "Calls not OK, by the stage that decided and the error type",
            refusals.clone(),
        );
        let rate_limited = Family::<ToolLabels, Counter>::default();
        registry.register(
            "rate_limited",
            "Calls refused by a rate limit",
            rate_limited.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "calls_in_flight",
            "Tool calls being decided or run now",
            in_flight.clone(),
        );
        let approvals_pending = Gauge::default();
        registry.register(
            "approvals_pending",
            "Approvals waiting for a decision",
            approvals_pending.clone(),
        );
        let audit_queue_depth = Gauge::default();
        registry.register(
            "audit_queue_depth",
            "Audit events waiting to be written",
            audit_queue_depth.clone(),
        );
        let audit_written = Gauge::default();
        registry.register(
            "audit_events_written",
            "Audit events written since start",
            audit_written.clone(),
        );
        let audit_dropped = Gauge::default();
        registry.register(
            "audit_events_dropped",
            "Audit events lost since start (should stay 0)",
            audit_dropped.clone(),
        );
        let snapshot_gauges = SnapshotGauges::register(&mut registry);
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "catalog_reloads",
            "Catalog reloads by result (ok, refused, restart_required)",
            reloads.clone(),
        );
        let catalog_polls = Counter::default();
        registry.register(
            "catalog_file_polls",
            "Times the catalog file was looked at for changes",
            catalog_polls.clone(),
        );
        let catalog_parses = Counter::default();
        registry.register(
            "catalog_file_parses",
            "Times the catalog file's text was parsed: when it was new or changed, and for each reload (an unchanged file is not parsed)",
            catalog_parses.clone(),
        );
        let revision = Family::<RevisionLabels, Gauge>::default();
        registry.register(
            "catalog_revision_info",
            "1 for the catalog revision being served",
            revision.clone(),
        );
        let state_up = Gauge::default();
        // Memory is always there; the Redis backend reports what it sees.
        state_up.set(1);
        registry.register(
            "state_backend_up",
            "1 while the state backend (memory, or the shared Redis) answers",
            state_up.clone(),
        );
        let state_failures = Family::<ConcernLabels, Counter>::default();
        registry.register(
            "state_failures",
            "Operations on the shared state that failed (timeout, unreachable, refused), by concern",
            state_failures.clone(),
        );
        let rate_limit_local = Counter::default();
        registry.register(
            "rate_limit_local_decisions",
            "Calls whose quota this sidecar decided alone because the shared state could not be reached (on_unavailable: local)",
            rate_limit_local.clone(),
        );
        Metrics {
            state_up,
            state_failures,
            rate_limit_local,
            unknown_tool: Arc::from(UNKNOWN_TOOL),
            registry: Mutex::new(registry),
            calls,
            durations,
            refusals,
            rate_limited,
            in_flight,
            approvals_pending,
            audit_queue_depth,
            audit_written,
            audit_dropped,
            snapshot_gauges,
            reloads,
            catalog_polls,
            catalog_parses,
            revision,
            current_revision: Mutex::new(String::new()),
        }
    }

    /// Registers a concern's metric family under `toolgate_<name>`: each concern (the shadow
    /// catalog, the listeners) owns its families and registers them when it starts.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(name, help, metric);
    }

    /// Counts a call in flight for as long as the returned guard lives.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(&self.in_flight)
    }

    /// Calls in flight now.
    pub fn calls_in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// Records a finished call; `known_tool` says whether the name is in the catalog.
    /// `tool`: the name of a tool the catalog has, shared with the call; `None` for any other,
    /// which are counted under one label so a client cannot grow the label sets.
    pub fn observe(&self, outcome: &CallOutcome, tool: Option<&Arc<str>>) {
        // Label sets are looked up by value: the call's shared copy of the name serves all of
        // them, and the rest of each label is static.
        let tool = tool.unwrap_or(&self.unknown_tool).clone();
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.clone(),
                status: outcome.status.as_str(),
            })
            .inc();
        self.durations
            .get_or_create(&ToolLabels { tool: tool.clone() })
            .observe(outcome.duration.as_secs_f64());
        if let Some(refusal) = &outcome.refusal {
            self.refusals
                .get_or_create(&RefusalLabels {
                    stage: refusal.stage.as_str(),
                    error_type: refusal.reason.code(),
                })
                .inc();
            if outcome.status == Status::RateLimited {
                self.rate_limited.get_or_create(&ToolLabels { tool }).inc();
            }
        }
    }

    /// Records a reload attempt: `ok`, `refused` (invalid) or `restart_required`.
    pub fn reload(&self, result: &'static str) {
        self.reloads
            .get_or_create(&ReloadLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Whether the state backend answers.
    pub fn state_backend_up(&self, up: bool) {
        self.state_up.set(i64::from(up));
    }

    /// An operation on the shared state failed; `concern` is one of a fixed few names.
    pub fn state_failure(&self, concern: &str) {
        self.state_failures
            .get_or_create(&ConcernLabels {
                concern: concern.to_owned(),
            })
            .inc();
    }

    /// A quota decided by this sidecar alone during an outage of the shared state.
    pub fn rate_limit_local_decision(&self) {
        self.rate_limit_local.inc();
    }

    /// The catalog revision now served.
    pub fn serving_revision(&self, revision: &str) {
        let mut current = self
            .current_revision
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *current != revision {
            self.revision.remove(&RevisionLabels {
                revision: current.clone(),
            });
            self.revision
                .get_or_create(&RevisionLabels {
                    revision: revision.to_owned(),
                })
                .set(1);
            *current = revision.to_owned();
        }
    }

    /// The catalog file was looked at; `parsed` when its text was parsed.
    pub fn catalog_file_polled(&self, parsed: bool) {
        self.catalog_polls.inc();
        if parsed {
            self.catalog_parses.inc();
        }
    }

    /// The catalog file was parsed to be loaded.
    pub fn catalog_file_parsed(&self) {
        self.catalog_parses.inc();
    }

    /// Prometheus text exposition.
    pub fn render(&self, snapshot: Snapshot) -> String {
        self.approvals_pending.set(snapshot.approvals_pending);
        self.audit_queue_depth.set(snapshot.audit_queue_depth);
        self.audit_written.set(snapshot.audit_written);
        self.audit_dropped.set(snapshot.audit_dropped);
        self.snapshot_gauges.set(&snapshot);
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = encode(&mut text, &registry) {
            tracing::error!(error = %err, "cannot encode metrics");
        }
        text
    }
}

/// See [`Metrics::in_flight`].
pub struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
