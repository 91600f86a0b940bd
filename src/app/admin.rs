//! The admin door: an HTTP endpoint serving `/metrics` (Prometheus text), `/healthz` (the
//! process is up) and `/readyz` (serving calls; 503 while shutting down, and while the shared
//! state cannot be reached when the config says it must be). It reads the concerns, it decides
//! nothing.
//!
//! Most families are counted by their concerns as things happen; the gauges here
//! ([`SnapshotGauges`]) are values only read from the concerns when `/metrics` is scraped: the
//! approvals pending, the audit queue and its writer, the spans lost, the stores' sizes, and
//! whether the catalog file needs a restart.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;

use super::StartError;
use crate::identity::IdentityHandle;
use crate::{
    audit::{AuditLog, RefusedCallers},
    boundary::Boundary,
    metrics::Metrics,
    state,
    tasks::Tasks,
    telemetry::spans::Tracer,
};

/// The admin endpoint, when enabled.
pub(super) struct AdminBinding {
    pub addr: SocketAddr,
    pub state: Arc<AdminState>,
}

/// What the admin endpoint reads, handed over by the server that built each part.
pub(super) struct Readings {
    /// For the sizes of its stores and the approvals pending.
    pub boundary: Arc<Boundary>,
    pub metrics: Arc<Metrics>,
    pub audit: AuditLog,
    /// For the spans its exporter lost.
    pub tracer: Tracer,
    pub backend: state::Backend,
    pub identity: IdentityHandle,
    pub refused: Arc<RefusedCallers>,
    pub restart_required: Arc<AtomicBool>,
    /// Whether an unreachable state backend makes the sidecar not ready.
    pub state_required: bool,
}

impl AdminBinding {
    pub(super) async fn start(
        addr: Option<SocketAddr>,
        readings: Readings,
        tasks: &Tasks,
    ) -> Result<Option<Self>, StartError> {
        let Some(addr) = addr else { return Ok(None) };
        let Readings {
            boundary,
            metrics,
            audit,
            tracer,
            backend,
            identity,
            refused,
            restart_required,
            state_required,
        } = readings;
        let state = Arc::new(AdminState {
            gauges: SnapshotGauges::register(&metrics),
            metrics,
            snapshot: Box::new(move || {
                let stores = boundary.store_bytes();
                let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                Snapshot {
                    calls_in_flight: gauge(boundary.in_flight()),
                    approvals_pending: gauge(boundary.pending_approvals()),
                    audit_queue_depth: gauge(audit.queued()),
                    audit_written: count(audit.written()),
                    audit_dropped: count(audit.dropped()),
                    audit_write_errors: count(audit.write_errors()),
                    audit_refused_callers_suppressed: count(refused.suppressed()),
                    spans_dropped: count(tracer.losses().queue_full()),
                    spans_export_failed: count(tracer.losses().export_failed()),
                    idempotency_bytes: gauge(stores.idempotency),
                    approvals_bytes: gauge(stores.approvals),
                    revision_log_bytes: gauge(stores.revision_log),
                    token_cache_bytes: gauge(identity.load().cache_bytes()),
                    restart_required: restart_required.load(Ordering::Relaxed),
                }
            }),
            ready: AtomicBool::new(true),
            state_reachable: Box::new(move || backend.reachable()),
            state_required,
        });
        let bound = serve_admin(addr, state.clone(), tasks)
            .await
            .map_err(|source| StartError::Listen {
                addr: addr.to_string(),
                source,
            })?;
        tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
        Ok(Some(AdminBinding { addr: bound, state }))
    }
}

/// What the admin endpoint reads.
pub(super) struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Set from `snapshot` before each rendering.
    pub gauges: SnapshotGauges,
    pub snapshot: Box<dyn Fn() -> Snapshot + Send + Sync>,
    /// False once shutting down.
    pub ready: AtomicBool,
    /// Whether the state backend answers now.
    pub state_reachable: Box<dyn Fn() -> bool + Send + Sync>,
    /// Whether an unreachable state backend makes the sidecar not ready.
    pub state_required: bool,
}

/// Values read from the concerns when scraped.
#[derive(Debug, Clone, Copy)]
pub(super) struct Snapshot {
    pub calls_in_flight: i64,
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

/// Gauges filled from a [`Snapshot`] when scraped, registered when the admin endpoint starts.
pub(super) struct SnapshotGauges {
    calls_in_flight: Gauge,
    approvals_pending: Gauge,
    audit_queue_depth: Gauge,
    audit_written: Gauge,
    audit_dropped: Gauge,
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
    fn register(metrics: &Metrics) -> Self {
        let gauge = |name: &str, help: &str| -> Gauge { metrics.registered(name, help) };
        SnapshotGauges {
            calls_in_flight: gauge("calls_in_flight", "Tool calls being decided or run now"),
            approvals_pending: gauge("approvals_pending", "Approvals waiting for a decision"),
            audit_queue_depth: gauge("audit_queue_depth", "Audit events waiting to be written"),
            audit_written: gauge("audit_events_written", "Audit events written since start"),
            audit_dropped: gauge(
                "audit_events_dropped",
                "Audit events lost since start (should stay 0)",
            ),
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
        self.calls_in_flight.set(snapshot.calls_in_flight);
        self.approvals_pending.set(snapshot.approvals_pending);
        self.audit_queue_depth.set(snapshot.audit_queue_depth);
        self.audit_written.set(snapshot.audit_written);
        self.audit_dropped.set(snapshot.audit_dropped);
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

/// Serves `/metrics`, `/healthz` (the process is up) and `/readyz` (serving calls) until
/// `tasks` is stopped.
async fn serve_admin(
    addr: SocketAddr,
    state: Arc<AdminState>,
    tasks: &Tasks,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readiness))
        .with_state(state);
    tasks.spawn("admin-endpoint", async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "admin endpoint stopped");
        }
    });
    Ok(bound)
}

async fn metrics_text(State(state): State<Arc<AdminState>>) -> impl IntoResponse {
    state.gauges.set(&(state.snapshot)());
    let body = state.metrics.render();
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
}

/// Ready unless shutting down, or — when the config says so — the state backend is
/// unreachable. The body says which, and whether the state backend answers.
async fn readiness(State(state): State<Arc<AdminState>>) -> impl IntoResponse {
    if !state.ready.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    match ((state.state_reachable)(), state.state_required) {
        (true, _) => (StatusCode::OK, "ready\n"),
        (false, false) => (StatusCode::OK, "ready; state backend unreachable\n"),
        (false, true) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: state backend unreachable\n",
        ),
    }
}
