//! The client's deadline, as a tower layer: `grpc-timeout` is read when the request arrives — the
//! same moment tonic starts its own timer — and the boundary is given a deadline a little
//! earlier, so the call ends with a TIMEOUT result (and its backend stops) before the transport
//! gives up on it.

use std::{
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::Instant;

use super::convert::grpc_timeout;

/// When the boundary must have answered.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Instant);

/// How much earlier than the client's deadline the boundary stops: a tenth, within bounds.
pub fn margin(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// Made once: a lookup by `&str` parses the name on every request.
static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// Puts a [`Deadline`] into the extensions of requests that carry `grpc-timeout`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeadlineLayer;

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService { inner }
    }
}

/// See [`DeadlineLayer`].
#[derive(Clone, Debug)]
pub struct DeadlineService<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for DeadlineService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let timeout = request
            .headers()
            .get(&GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout);
        // A deadline too far away to represent (years) is no deadline at all.
        if let Some(timeout) = timeout
            && let Some(deadline) =
                Instant::now().checked_add(timeout.saturating_sub(margin(timeout)))
        {
            request.extensions_mut().insert(Deadline(deadline));
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_scales_within_bounds() {
        assert_eq!(margin(Duration::from_millis(50)), Duration::from_millis(10));
        assert_eq!(
            margin(Duration::from_millis(300)),
            Duration::from_millis(30)
        );
        assert_eq!(margin(Duration::from_secs(60)), Duration::from_millis(250));
    }
}
