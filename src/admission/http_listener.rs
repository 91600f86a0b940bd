//! An HTTP door's TCP listener (the MCP door's, the console's) under the same connection rules
//! as the gRPC door's: a cap of its own (`limits.max_connections_per_listener`), the handshake
//! and idle timeouts, the connection counted in `toolgate_connections_*{listener="mcp"}` (or
//! `"console"`). Each request carries its [`Connection`], so admission counts it as the
//! connection's activity.
//!
//! Its connections are served here rather than by `axum::serve` so that each connection's task
//! can be polled through [`RepollOnSelfWake`]: hyper's HTTP/1 connection wakes its own task for
//! every request with a body, which would wake a second worker per call.

use std::net::SocketAddr;

use axum::{Extension, Router, extract::ConnectInfo};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::Layer;

use super::{
    connections::{Admission, Connection, Watched},
    self_wake::RepollOnSelfWake,
};

pub struct WatchedListener {
    pub inner: TcpListener,
    pub admission: Admission,
}

impl WatchedListener {
    /// The next connection admitted, with what the requests on it carry.
    async fn accept(&mut self) -> (Watched<TcpStream>, Connection) {
        loop {
            let stream = match self.inner.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of descriptors and the like: wait a moment rather than spin (as axum's
                    // own listener does).
                    tracing::warn!(listener = self.admission.listener().as_str(), error = %err, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Small answers go out at once, not after a delayed ACK.
            let _ = stream.set_nodelay(true);
            if let Some(watched) = self.admission.admit(stream, peer) {
                let connection = tonic::transport::server::Connected::connect_info(&watched);
                return (watched, connection);
            }
        }
    }
}

fn peer(stream: &TcpStream) -> Option<SocketAddr> {
    stream.peer_addr().ok()
}

/// Serves `router` on every connection `listener` admits (HTTP/1.1, and HTTP/2 with prior
/// knowledge, as `axum::serve` does) until `close` is cancelled; then accepts no more, asks each
/// connection to finish the requests it has and close, and returns once they all have.
pub async fn serve(mut listener: WatchedListener, router: Router, close: CancellationToken) {
    let connections = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (io, connection) = tokio::select! {
            biased;
            () = close.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let service = Extension(ConnectInfo(connection)).layer(router.clone());
        let served = builder
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(service))
            .into_owned();
        let served = connections.watch(served);
        tokio::spawn(RepollOnSelfWake::new(async move {
            if let Err(err) = served.await {
                tracing::trace!(error = %err, "an HTTP connection ended with an error");
            }
        }));
    }
    drop(listener);
    connections.shutdown().await;
}
