//! The sidecar-wide caps on RPCs in flight, as a tower layer: beyond `limits.max_in_flight`
//! calls, or `limits.max_request_bytes_in_flight` bytes of requests held (read and not yet
//! answered), a toolgate RPC is refused at once with RESOURCE_EXHAUSTED (retryable) instead of
//! queueing or buffering without bound. While the sidecar drains for shutdown, every new toolgate
//! RPC — on a new connection or one opened before — is answered UNAVAILABLE (retryable) while the
//! calls already running finish. Health checks and reflection are never refused: a busy or
//! draining sidecar must still answer its probes.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::{FutureExt, future::BoxFuture};
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The paths the cap applies to: the toolgate services.
const LIMITED_PREFIX: &str = "/toolgate.v1.";

/// Request bytes are counted in units of this many bytes.
const UNIT: usize = 1024;

/// See the module docs.
#[derive(Clone, Debug)]
pub struct InFlightLayer {
    slots: Arc<Semaphore>,
    max: usize,
    /// Units of request bytes that may be held at once.
    bytes: Arc<Semaphore>,
    max_bytes: usize,
    /// Set when shutdown begins: new RPCs are refused, running ones finish.
    draining: Arc<AtomicBool>,
}

impl InFlightLayer {
    pub fn new(max: usize, max_bytes: usize) -> Self {
        InFlightLayer {
            slots: Arc::new(Semaphore::new(max)),
            max,
            bytes: Arc::new(Semaphore::new(
                (max_bytes / UNIT).min(Semaphore::MAX_PERMITS),
            )),
            max_bytes,
            draining: Arc::new(AtomicBool::new(false)),
        }
    }

    /// From now on, new toolgate RPCs are answered UNAVAILABLE.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether no toolgate RPC is being served.
    pub fn idle(&self) -> bool {
        self.slots.available_permits() == self.max
    }
}

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlightService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightService {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`InFlightLayer`].
#[derive(Clone, Debug)]
pub struct InFlightService<S> {
    inner: S,
    layer: InFlightLayer,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for InFlightService<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if !request.uri().path().starts_with(LIMITED_PREFIX) {
            return Box::pin(self.inner.call(request));
        }
        if self.layer.draining.load(Ordering::SeqCst) {
            let status = tonic::Status::unavailable(
                "the sidecar is shutting down; retry on another instance or after it restarts",
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let Ok(slot) = self.layer.slots.clone().try_acquire_owned() else {
            let status = tonic::Status::resource_exhausted(format!(
                "the sidecar has {} calls in flight (limits.max_in_flight); retry shortly",
                self.layer.max
            ));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        // The request's bytes are held until its answer is sent (its decoded copy lives that long).
        let held = Arc::new(Mutex::new(None));
        let request = request.map(|body| {
            tonic::body::Body::new(Metered {
                inner: body,
                bytes: self.layer.bytes.clone(),
                max_bytes: self.layer.max_bytes,
                held: held.clone(),
            })
        });
        // `map`, not an `async` block: a block would hold the inner future twice, once as
        // captured and once as awaited (rust-lang/rust#62958), ~300 bytes per call in flight.
        Box::pin(self.inner.call(request).map(move |response| {
            drop((slot, held));
            response
        }))
    }
}

/// A request body that takes a share of the sidecar's request-byte budget for each frame it
/// reads, and fails with RESOURCE_EXHAUSTED when the budget has none left.
struct Metered {
    inner: tonic::body::Body,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
    held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(status))) => return Poll::Ready(Some(Err(status))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            let units = u32::try_from(data.len().div_ceil(UNIT)).unwrap_or(u32::MAX);
            match self.bytes.clone().try_acquire_many_owned(units) {
                Ok(permit) => {
                    let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                    match held.as_mut() {
                        Some(all) => all.merge(permit),
                        None => *held = Some(permit),
                    }
                }
                Err(_) => {
                    return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(format!(
                        "the sidecar holds {} bytes of requests (limits.max_request_bytes_in_flight); retry shortly",
                        self.max_bytes
                    )))));
                }
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
