//! The door's TCP listener under the same connection rules as the gRPC door's: a cap of its own
//! (`limits.max_connections_per_listener`), the handshake and idle timeouts, the connection
//! counted in `toolgate_connections_*{listener="mcp"}`. Each request carries its [`Connection`],
//! so admission counts it as the connection's activity.

use std::net::SocketAddr;

use axum::{extract::connect_info::Connected, serve::IncomingStream};
use tokio::net::{TcpListener, TcpStream};

use crate::admission::connections::{Admission, Connection, Watched};

pub struct WatchedListener {
    pub inner: TcpListener,
    pub admission: Admission,
}

impl axum::serve::Listener for WatchedListener {
    type Io = Watched<TcpStream>;
    type Addr = Connection;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let stream = match self.inner.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of descriptors and the like: wait a moment rather than spin (as axum's
                    // own listener does).
                    tracing::warn!(error = %err, "MCP listener: accept failed");
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

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        // axum asks only to log it; the connection of a listener has no peer.
        Err(std::io::Error::other("a listener has no connection"))
    }
}

fn peer(stream: &TcpStream) -> Option<SocketAddr> {
    stream.peer_addr().ok()
}

impl Connected<IncomingStream<'_, WatchedListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, WatchedListener>) -> Self {
        stream.remote_addr().clone()
    }
}
