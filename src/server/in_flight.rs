//! The sidecar-wide cap on RPCs in flight, as a tower layer: beyond `limits.max_in_flight`, a
//! toolgate RPC is refused at once with RESOURCE_EXHAUSTED (retryable) instead of queueing without
//! bound. Health checks and reflection are never refused: a busy sidecar must still answer its
//! probes.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use tokio::sync::Semaphore;

/// The paths the cap applies to: the toolgate services.
const LIMITED_PREFIX: &str = "/toolgate.v1.";

/// See the module docs.
#[derive(Clone, Debug)]
pub struct InFlightLayer {
    slots: Arc<Semaphore>,
    max: usize,
}

impl InFlightLayer {
    pub fn new(max: usize) -> Self {
        InFlightLayer {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlightService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightService {
            inner,
            slots: self.slots.clone(),
            max: self.max,
        }
    }
}

/// See [`InFlightLayer`].
#[derive(Clone, Debug)]
pub struct InFlightService<S> {
    inner: S,
    slots: Arc<Semaphore>,
    max: usize,
}

impl<S, B> tower::Service<http::Request<B>> for InFlightService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !request.uri().path().starts_with(LIMITED_PREFIX) {
            return Box::pin(self.inner.call(request));
        }
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let response = self.inner.call(request);
                Box::pin(async move {
                    let response = response.await;
                    drop(slot);
                    response
                })
            }
            Err(_) => {
                let status = tonic::Status::resource_exhausted(format!(
                    "the sidecar has {} calls in flight (limits.max_in_flight); retry shortly",
                    self.max
                ));
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
