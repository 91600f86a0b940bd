//! Accepted connections, counted and watched. Each listener holds at most
//! `limits.max_connections_per_listener` connections at once, with a cap of its own, so TCP
//! callers cannot take the Unix socket's (the agent's in the pod); a connection over the cap is
//! closed as soon as it is accepted. A new connection must send the HTTP/2 preface and the
//! header of its first frame (on the MCP door's listener: as many bytes of its first request)
//! within `limits.handshake_timeout`, and one that carries no toolgate
//! RPC for `limits.idle_connection_timeout` is closed: silent and idle connections cannot hold
//! file descriptors and memory for as long as their peer likes.
//!
//! What a connection is doing is told by the admission layer ([`super::admission`]), which finds
//! the connection's [`Connection`] among each request's extensions (tonic puts a connection's
//! `ConnectInfo` there) and counts its RPCs in [`Activity`].

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use super::refusals::Refusals;
use crate::settings::LimitsConfig;

/// The client preface (24 bytes) and the header of the SETTINGS frame that must follow it; an
/// HTTP/1.1 request line and its first header are longer.
const HANDSHAKE_BYTES: usize = 24 + 9;

/// Which listener a connection came in on; a metrics label, and what the Unix socket's reserve
/// of call slots is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Listener {
    Tcp,
    Unix,
    /// The MCP door's (HTTP/1.1 or HTTP/2 over TCP): TCP callers, under a cap of its own.
    Mcp,
    /// The approvals console's: people's browsers, under a cap of its own.
    Console,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Tcp => "tcp",
            Listener::Unix => "unix",
            Listener::Mcp => "mcp",
            Listener::Console => "console",
        }
    }
}

/// A listener's connection cap and the timeouts its connections live by.
#[derive(Clone)]
pub struct Admission {
    listener: Listener,
    open: Arc<Semaphore>,
    max: usize,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    refusals: Arc<Refusals>,
}

impl Admission {
    /// The listener it admits connections to.
    pub fn listener(&self) -> Listener {
        self.listener
    }

    pub fn new(listener: Listener, limits: &LimitsConfig, refusals: Arc<Refusals>) -> Self {
        Admission {
            listener,
            open: Arc::new(Semaphore::new(limits.max_connections_per_listener)),
            max: limits.max_connections_per_listener,
            handshake_timeout: limits.handshake_timeout,
            idle_timeout: limits.idle_connection_timeout,
            refusals,
        }
    }

    /// The connections `incoming` accepts, each watched; one over the cap is closed (dropped)
    /// and counted instead. `peer` says who is on the other end, for logs and audit events.
    pub fn each<T, E>(
        self,
        incoming: impl Stream<Item = Result<T, E>>,
        peer: fn(&T) -> Option<SocketAddr>,
    ) -> impl Stream<Item = Result<Watched<T>, E>> {
        incoming.filter_map(move |accepted| match accepted {
            Err(err) => Some(Err(err)),
            Ok(io) => self.admit(io, peer).map(Ok),
        })
    }

    /// `io` watched, or `None` (dropped, so closed, and counted) when the listener is full.
    pub fn admit<T>(&self, io: T, peer: fn(&T) -> Option<SocketAddr>) -> Option<Watched<T>> {
        match self.open.clone().try_acquire_owned() {
            Ok(permit) => Some(self.watch(io, permit, peer)),
            Err(_) => {
                self.refusals.connection(
                    self.listener,
                    "over_cap",
                    format_args!(
                        "connection closed: the {} listener holds {} connections (limits.max_connections_per_listener)",
                        self.listener.as_str(),
                        self.max
                    ),
                );
                None
            }
        }
    }

    fn watch<T>(
        &self,
        io: T,
        permit: OwnedSemaphorePermit,
        peer: fn(&T) -> Option<SocketAddr>,
    ) -> Watched<T> {
        let connection = Connection {
            listener: self.listener,
            peer: peer(&io),
            activity: Arc::new(Activity::new()),
        };
        self.refusals.connection_opened(self.listener);
        Watched {
            io,
            connection,
            handshake_left: HANDSHAKE_BYTES,
            timer: Box::pin(tokio::time::sleep(self.handshake_timeout)),
            idle_timeout: self.idle_timeout,
            refusals: self.refusals.clone(),
            _permit: permit,
        }
    }
}

/// What a connection's requests carry in their extensions: where they came from, and the
/// counter of the connection's RPCs.
#[derive(Clone, Debug)]
pub struct Connection {
    pub listener: Listener,
    /// The TCP peer; none on the Unix socket.
    pub peer: Option<SocketAddr>,
    pub activity: Arc<Activity>,
}

/// The toolgate RPCs of one connection: how many are running, and when the last one ended.
#[derive(Debug)]
pub struct Activity {
    running: AtomicUsize,
    /// When the connection last had an RPC end, in milliseconds since `since`.
    last_end_ms: AtomicU64,
    since: Instant,
}

impl Activity {
    fn new() -> Self {
        Activity {
            running: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// Counts an RPC as running until the returned guard is dropped.
    pub fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    /// When the connection has been idle long enough to close, or `None` while it is not
    /// idle (an RPC is running).
    fn idle_until(&self, idle_timeout: Duration) -> Option<Instant> {
        if self.running.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
        Some(self.since + last + idle_timeout)
    }
}

/// An RPC running on a connection; see [`Activity::start`].
pub struct Running(Arc<Activity>);

impl Drop for Running {
    fn drop(&mut self) {
        let elapsed = u64::try_from(self.0.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.fetch_max(elapsed, Ordering::AcqRel);
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted connection under its handshake and idle timeouts, holding its place under the
/// listener's cap until it is dropped.
pub struct Watched<T> {
    io: T,
    connection: Connection,
    /// Bytes still to be read before the handshake counts as done.
    handshake_left: usize,
    /// The handshake's deadline, then the next time idleness is checked.
    timer: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    refusals: Arc<Refusals>,
    _permit: OwnedSemaphorePermit,
}

impl<T> Watched<T> {
    /// Whether the connection must be closed now; otherwise the timer is set for the next
    /// check and will wake the connection's reader. Polled with every read: hyper keeps a
    /// read pending on an HTTP/2 connection for as long as it is open.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<&'static str> {
        // Bounded: each turn either returns or moves the timer later than now.
        for _ in 0..4 {
            if self.timer.as_mut().poll(cx).is_pending() {
                return None;
            }
            if self.handshake_left > 0 {
                return Some("handshake_timeout");
            }
            match self.connection.activity.idle_until(self.idle_timeout) {
                Some(until) if until <= Instant::now() => return Some("idle"),
                Some(until) => self.timer.as_mut().reset(until),
                // Checked again one idle timeout from now; an RPC that ends meanwhile moves
                // the time of the next close further out, never closer.
                None => self
                    .timer
                    .as_mut()
                    .reset(Instant::now() + self.idle_timeout),
            }
        }
        // The timer was just moved past now: this registers the wake-up.
        let _ = self.timer.as_mut().poll(cx);
        None
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(why) = this.expired(cx) {
            let listener = this.connection.listener;
            match why {
                "handshake_timeout" => this.refusals.connection(
                    listener,
                    why,
                    format_args!(
                        "connection closed: a {} connection sent no {} within limits.handshake_timeout",
                        listener.as_str(),
                        match listener {
                            Listener::Mcp => "request",
                            _ => "HTTP/2 handshake",
                        }
                    ),
                ),
                // Closing an idle connection is upkeep, not a refusal: counted, not logged.
                _ => this.refusals.connection_counted(listener, why),
            }
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.handshake_left > 0 && matches!(read, Poll::Ready(Ok(()))) {
            let got = buf.filled().len() - before;
            this.handshake_left = this.handshake_left.saturating_sub(got);
            if this.handshake_left == 0 {
                this.timer
                    .as_mut()
                    .reset(Instant::now() + this.idle_timeout);
            }
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        self.refusals.connection_ended(self.connection.listener);
    }
}

impl<T> Connected for Watched<T> {
    type ConnectInfo = Connection;

    fn connect_info(&self) -> Connection {
        self.connection.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_with_nothing_running_for_the_whole_timeout() {
        let activity = Arc::new(Activity::new());
        let timeout = Duration::from_secs(60);
        let opened = Instant::now();
        assert_eq!(activity.idle_until(timeout), Some(opened + timeout));
        let running = activity.start();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(activity.idle_until(timeout), None, "an RPC is running");
        drop(running);
        assert_eq!(
            activity.idle_until(timeout),
            Some(opened + Duration::from_secs(90) + timeout),
            "idle counts from the end of the last RPC"
        );
    }
}
