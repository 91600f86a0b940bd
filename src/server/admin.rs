//! The admin door: an HTTP endpoint serving `/metrics` (Prometheus text), `/healthz` (the
//! process is up) and `/readyz` (serving calls; 503 while shutting down, and while the shared
//! state cannot be reached when the config says it must be). It reads the concerns, it decides
//! nothing.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio::net::TcpListener;

use super::{StartError, services::IdentityHandle};
use crate::{
    audit::{AuditLog, RefusedCallers},
    boundary::Boundary,
    metrics::{Metrics, Snapshot},
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
            metrics,
            snapshot: Box::new(move || {
                let stores = boundary.store_bytes();
                let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                Snapshot {
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
    pub snapshot: Box<dyn Fn() -> Snapshot + Send + Sync>,
    /// False once shutting down.
    pub ready: AtomicBool,
    /// Whether the state backend answers now.
    pub state_reachable: Box<dyn Fn() -> bool + Send + Sync>,
    /// Whether an unreachable state backend makes the sidecar not ready.
    pub state_required: bool,
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
    let body = state.metrics.render((state.snapshot)());
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
