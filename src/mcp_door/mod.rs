//! The MCP door: the boundary's tools served to MCP hosts over MCP's Streamable HTTP transport
//! (rmcp's server side, in axum), statelessly, so any replica answers any request. Like the gRPC
//! door (`server`), it only converts: its admission is the gRPC door's (identity from the
//! headers, the same caps, counted together), `tools/list` is ListTools and `tools/call` is
//! `Boundary::execute`. What the transport requires of a server — one POST endpoint, `Host` and
//! `Origin` checked, notifications answered 202, JSON or SSE answers, `server/discover`, the
//! `Mcp-Method`/`Mcp-Name` headers checked against the body (-32020), bodies bounded — is rmcp's.
//! One exception, for cost: a 2025-11-25 `tools/call` in its plain shape, which all of those
//! checks let through unchanged, is answered by `plain_calls` without rmcp's per-request service,
//! by the same handler code and in the same JSON.

mod approval_state;
mod cancels;
pub mod convert;
mod handler;
mod oauth;
mod plain_calls;

pub use handler::SERVED_REVISIONS;

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, routing::get};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    admission::{AdmissionLayer, connections, http_listener},
    boundary::Boundary,
    settings::{LimitsConfig, McpDoorConfig},
    tasks::Tasks,
    telemetry::spans::{TraceContextLayer, Tracer},
};

/// What the door is built from.
pub struct Parts {
    pub boundary: Arc<Boundary>,
    pub admission: AdmissionLayer,
    /// The listener's own connection cap and timeouts.
    pub connections: connections::Admission,
    pub limits: LimitsConfig,
    pub tracer: Tracer,
    /// How long an approval lives: how long its sealed request state opens.
    pub approval_ttl: std::time::Duration,
}

/// The door's listener, bound, and the resource it is (the audience of its tokens).
pub struct Bound {
    listener: TcpListener,
    pub addr: SocketAddr,
    pub resource: String,
}

/// Binds the door's listener (`listen` overrides `server.mcp.listen`), before anything is
/// served: the resource an unconfigured door is named by is the address bound.
pub async fn bind(config: &McpDoorConfig, listen: Option<SocketAddr>) -> std::io::Result<Bound> {
    let listener = TcpListener::bind(listen.unwrap_or(config.listen)).await?;
    let addr = listener.local_addr()?;
    Ok(Bound {
        listener,
        addr,
        resource: config.resource_at(addr),
    })
}

/// Serves the bound door on `listeners` until `close` is cancelled.
pub fn start(
    config: &McpDoorConfig,
    bound: Bound,
    parts: Parts,
    listeners: &Tasks,
    close: CancellationToken,
) {
    let Bound {
        listener,
        addr: bound,
        resource,
    } = bound;
    let cancels = Arc::new(cancels::Cancels::default());
    let handler = Arc::new(handler::Handler {
        cancels: cancels.clone(),
        boundary: parts.boundary,
        limits: parts.limits.clone(),
        tracer: parts.tracer,
        request_timeout: config.request_timeout,
        approvals_url: config.approvals_url.clone(),
        admission: parts.admission.clone(),
        states: approval_state::ApprovalStates::new(
            config.request_state_key.as_deref(),
            parts.approval_ttl,
        ),
    });
    let mut transport = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_cancellation_token(close.child_token())
        .with_max_request_body_bytes(parts.limits.max_message_bytes)
        .with_allowed_hosts(allowed_hosts(&config.allowed_hosts, bound))
        .with_allowed_origins(config.allowed_origins.clone());
    // No Origin configured: a request carrying any Origin (a browser page) is refused.
    if config.allowed_origins.is_empty() {
        transport = transport.enforce_origin_validation();
    }
    let plain = Arc::new(plain_calls::PlainCalls {
        handler: handler.clone(),
        allowed_hosts: transport.allowed_hosts.clone(),
        max_body_bytes: parts.limits.max_message_bytes,
    });
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        transport,
    );
    let gate = Arc::new(oauth::Gate::new(config, resource, parts.admission));
    let metadata_path = oauth::metadata_path(&config.path);
    let mut router = Router::new()
        .route_service(&config.path, service)
        .route_layer(axum::middleware::from_fn_with_state(
            plain,
            plain_calls::answer,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            cancels,
            cancels::notices,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            gate.clone(),
            oauth::admit,
        ))
        .route(
            "/.well-known/oauth-protected-resource",
            get(oauth::metadata),
        );
    if metadata_path != "/.well-known/oauth-protected-resource" {
        router = router.route(&metadata_path, get(oauth::metadata));
    }
    let router = router.with_state(gate).layer(TraceContextLayer);
    let listener = http_listener::WatchedListener {
        inner: listener,
        admission: parts.connections,
    };
    listeners.spawn("mcp-http", http_listener::serve(listener, router, close));
    tracing::info!(addr = %bound, path = %config.path, "serving MCP over Streamable HTTP");
}

/// A request body read whole, up to `limit` bytes; a 400 when it cannot be.
async fn read_body(
    body: axum::body::Body,
    limit: usize,
) -> Result<axum::body::Bytes, axum::response::Response> {
    use axum::response::IntoResponse;
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        (
            http::StatusCode::BAD_REQUEST,
            format!("the request body could not be read: {err}"),
        )
            .into_response()
    })
}

/// The configured hosts, each also with the port actually bound (rmcp compares `host:port`
/// entries exactly, bare hosts on any port).
fn allowed_hosts(configured: &[String], bound: SocketAddr) -> Vec<String> {
    configured
        .iter()
        .flat_map(|host| [host.clone(), format!("{host}:{}", bound.port())])
        .collect()
}
