//! The admission of the doors' requests (gRPC RPCs, as a tower layer; MCP requests, through
//! [`AdmissionLayer::admit`]), one budget for both: who is calling, and whether the sidecar has
//! room for the call, decided from the request's headers before its body is read.
//!
//! In order, for every RPC of a `toolgate.v1` service:
//! 1. while the sidecar drains for shutdown, UNAVAILABLE (retryable);
//! 2. the caller is identified from the metadata (identity never comes from the body): a caller
//!    who cannot be is refused UNAUTHENTICATED at once, audited and logged (both bounded in
//!    rate), and holds nothing — so no unauthenticated stream can take what callers need;
//! 3. one of `limits.max_in_flight` call slots, of which TCP callers may take all but
//!    `limits.in_flight_reserved_for_unix_socket`: the agent on the Unix socket always finds
//!    room;
//! 4. one of the tenant's `limits.max_in_flight_per_tenant`: no tenant takes the whole sidecar;
//! 5. while the body is read, its bytes from `limits.max_request_bytes_in_flight` (held until the
//!    answer is sent), and the whole body within `limits.request_body_timeout`.
//!
//! Over a cap, RESOURCE_EXHAUSTED (retryable) at once, never a queue. Every refusal is counted
//! and logged by [`Refusals`]. Health checks and reflection pass untouched: a busy or draining
//! sidecar must still answer its probes.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures::{FutureExt, future::BoxFuture};
use http_body::Frame;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};

pub mod connections;
pub mod http_listener;
pub mod refusals;
mod self_wake;

use crate::{
    audit::{AuditLog, RefusedCallers},
    identity::{Caller, IdentityError, IdentityHandle, RemoteKeys},
    settings::LimitsConfig,
    tasks::Tasks,
};
use connections::{Connection, Listener};
use refusals::Refusals;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// The paths admission applies to: the toolgate services.
const LIMITED_PREFIX: &str = "/toolgate.v1.";

/// Request bytes are counted in units of this many bytes.
const UNIT: usize = 1024;

/// The identified caller of an admitted RPC, in its request's extensions.
#[derive(Clone, Debug)]
pub struct Identified(pub Arc<Caller>);

/// See the module docs.
#[derive(Clone)]
pub struct AdmissionLayer {
    shared: Arc<Shared>,
}

struct Shared {
    /// Where refused callers are recorded.
    audit: AuditLog,
    identity: IdentityHandle,
    refused: Arc<RefusedCallers>,
    refusals: Arc<Refusals>,
    slots: Arc<Semaphore>,
    max: usize,
    /// What TCP callers may take of `slots`.
    tcp_slots: Arc<Semaphore>,
    tcp_max: usize,
    tenants: Arc<TenantShares>,
    /// Units of request bytes that may be held at once.
    bytes: Arc<Semaphore>,
    max_bytes: usize,
    body_timeout: Duration,
    /// Set when shutdown begins: new RPCs are refused, running ones finish.
    draining: AtomicBool,
    /// Cancelled when shutdown begins, for requests that would otherwise never end (an MCP
    /// host's subscription).
    drain_started: tokio_util::sync::CancellationToken,
    /// The RPCs admitted and not answered yet, counted by what admitted them.
    rpcs: Tasks,
}

impl AdmissionLayer {
    pub fn new(
        limits: &LimitsConfig,
        audit: AuditLog,
        identity: IdentityHandle,
        refused: Arc<RefusedCallers>,
        refusals: Arc<Refusals>,
    ) -> Self {
        let tcp_max = limits.max_in_flight - limits.in_flight_reserved_for_unix_socket;
        AdmissionLayer {
            shared: Arc::new(Shared {
                audit,
                identity,
                refused,
                refusals,
                slots: Arc::new(Semaphore::new(limits.max_in_flight)),
                max: limits.max_in_flight,
                tcp_slots: Arc::new(Semaphore::new(tcp_max)),
                tcp_max,
                tenants: Arc::new(TenantShares {
                    max: limits.max_in_flight_per_tenant,
                    held: Mutex::new(HashMap::new()),
                }),
                bytes: Arc::new(Semaphore::new(
                    (limits.max_request_bytes_in_flight / UNIT).min(Semaphore::MAX_PERMITS),
                )),
                max_bytes: limits.max_request_bytes_in_flight,
                body_timeout: limits.request_body_timeout,
                draining: AtomicBool::new(false),
                drain_started: tokio_util::sync::CancellationToken::new(),
                rpcs: Tasks::new(),
            }),
        }
    }

    /// From now on, new toolgate RPCs are answered UNAVAILABLE.
    pub fn start_draining(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
        self.shared.drain_started.cancel();
    }

    /// Resolves once shutdown has begun.
    pub async fn drain_started(&self) {
        self.shared.drain_started.cancelled().await;
    }

    /// Waits until no toolgate RPC is being served (after [`Self::start_draining`], none starts).
    pub async fn idle(&self) {
        self.shared.rpcs.finished().await;
    }
}

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = AdmissionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// See [`AdmissionLayer`].
#[derive(Clone)]
pub struct AdmissionService<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What an admitted RPC holds until its answer is sent.
struct Held {
    _rpc: TaskTrackerToken,
    _slot: OwnedSemaphorePermit,
    _tcp_slot: Option<OwnedSemaphorePermit>,
    _share: Share,
    _running: Option<connections::Running>,
}

/// Why a request was not admitted; each door answers it in its own protocol.
#[derive(Debug)]
pub enum Refused {
    /// Shutdown has begun (retryable elsewhere).
    Draining(&'static str),
    /// The caller could not be identified.
    Unauthenticated(IdentityError),
    /// A cap is full (retryable shortly).
    Exhausted(String),
}

impl Refused {
    /// As the gRPC door answers it.
    pub fn status(&self) -> tonic::Status {
        match self {
            Refused::Draining(message) => tonic::Status::unavailable(*message),
            Refused::Unauthenticated(err) => tonic::Status::unauthenticated(err.to_string()),
            Refused::Exhausted(message) => tonic::Status::resource_exhausted(message.clone()),
        }
    }
}

/// Which verifier a door's callers are identified by: the MCP door's tokens must name it as
/// their audience (its resource), the gRPC door's the configured audience.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentifiedBy {
    Grpc,
    McpResource,
}

impl AdmissionLayer {
    /// Steps 1-4 of the module docs for a request of any door; what it holds is given back when
    /// the returned value is dropped (once the answer is sent).
    pub async fn admit<B>(
        &self,
        request: &mut http::Request<B>,
        by: IdentifiedBy,
    ) -> Result<Admitted, Refused> {
        self.shared
            .admit_refetching(request, by)
            .await
            .map(Admitted)
    }

    /// `body`, counted against `limits.max_request_bytes_in_flight` and bounded in time by
    /// `limits.request_body_timeout`, as the gRPC door's bodies are.
    /// The bytes are held until the returned [`HeldBytes`] is dropped (once the answer is sent).
    pub fn meter_body(
        &self,
        body: tonic::body::Body,
        listener: Listener,
    ) -> (tonic::body::Body, HeldBytes) {
        let (metered, bytes_held) = self.shared.clone().metered(body, listener);
        (metered, HeldBytes(bytes_held))
    }
}

/// The request bytes a metered body took; given back when dropped.
pub struct HeldBytes(#[expect(dead_code, reason = "held for its drop")] BytesHeld);

/// What an admitted request holds until its answer is sent.
pub struct Admitted(#[expect(dead_code, reason = "held for its drop")] Held);

/// Why [`Shared::admit`] did not admit a request.
enum Refusal {
    Refused(Refused),
    /// The caller's token may verify once its issuer's keys are fetched again (it names a key
    /// not seen yet): fetch, then admit once more.
    Refetch(Arc<RemoteKeys>),
}

impl From<Refused> for Refusal {
    fn from(refused: Refused) -> Self {
        Refusal::Refused(refused)
    }
}

impl Shared {
    /// [`Shared::admit`], fetching the issuer's keys again (within its rate limit) for a token
    /// that names a key not seen yet, then admitting once more.
    async fn admit_refetching<B>(
        &self,
        request: &mut http::Request<B>,
        by: IdentifiedBy,
    ) -> Result<Held, Refused> {
        match self.admit(request, by, true) {
            Ok(held) => Ok(held),
            Err(Refusal::Refused(refused)) => Err(refused),
            Err(Refusal::Refetch(keys)) => {
                keys.refetch_for_unknown_key().await;
                self.admit_again(request, by)
            }
        }
    }

    /// A request admitted again after its issuer's keys were fetched (no second fetch).
    fn admit_again<B>(
        &self,
        request: &mut http::Request<B>,
        by: IdentifiedBy,
    ) -> Result<Held, Refused> {
        self.admit(request, by, false)
            .map_err(|refusal| match refusal {
                Refusal::Refused(refused) => refused,
                Refusal::Refetch(_) => Refused::Unauthenticated(IdentityError::KeysUnavailable(
                    "the issuer's keys are being fetched; retry".into(),
                )),
            })
    }

    /// Steps 1-4 of the module docs; the refusal otherwise. With `may_refetch`, a token naming
    /// a key not seen yet is answered with [`Refusal::Refetch`] instead of a refusal.
    fn admit<B>(
        &self,
        request: &mut http::Request<B>,
        by: IdentifiedBy,
        may_refetch: bool,
    ) -> Result<Held, Refusal> {
        let connection = request.extensions().get::<Connection>().cloned();
        let listener = connection.as_ref().map_or(Listener::Tcp, |c| c.listener);
        if self.draining.load(Ordering::SeqCst) {
            self.refusals.rpc_counted(listener, "draining");
            return Err(Refused::Draining(
                "the sidecar is shutting down; retry on another instance or after it restarts",
            )
            .into());
        }
        let caller = self.identify(request, by, listener, connection.as_ref(), may_refetch)?;
        let tcp_slot = match listener {
            Listener::Unix => None,
            Listener::Tcp | Listener::Mcp | Listener::Console => {
                match self.tcp_slots.clone().try_acquire_owned() {
                    Ok(slot) => Some(slot),
                    Err(_) => return Err(self.full(listener, self.tcp_max).into()),
                }
            }
        };
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return Err(self.full(listener, self.max).into());
        };
        let Some(share) = self.tenants.try_take(&caller.tenant) else {
            self.refusals.rpc(
                listener,
                "tenant_share",
                format_args!(
                    "rpc refused: a tenant has {} RPCs in flight (limits.max_in_flight_per_tenant)",
                    self.tenants.max
                ),
            );
            return Err(Refused::Exhausted(format!(
                "tenant {} has {} calls in flight (limits.max_in_flight_per_tenant); retry shortly",
                caller.tenant, self.tenants.max
            ))
            .into());
        };
        request.extensions_mut().insert(Identified(caller));
        Ok(Held {
            _rpc: self.rpcs.count(),
            _slot: slot,
            _tcp_slot: tcp_slot,
            _share: share,
            _running: connection.map(|c| c.activity.start()),
        })
    }

    /// The caller, from the headers only. A refused caller is audited and logged (both bounded
    /// in rate), without any token material.
    fn identify<B>(
        &self,
        request: &http::Request<B>,
        by: IdentifiedBy,
        listener: Listener,
        connection: Option<&Connection>,
        may_refetch: bool,
    ) -> Result<Arc<Caller>, Refusal> {
        let identity = self.identity.load();
        let for_mcp = by == IdentifiedBy::McpResource;
        let resolved = if for_mcp {
            identity.resolve_for_mcp(request.headers())
        } else {
            identity.resolve(request.headers())
        };
        resolved.map_err(|err| {
            if may_refetch
                && let Some(keys) = identity.keys_to_refetch(&err, request.headers(), for_mcp)
            {
                return Refusal::Refetch(keys);
            }
            let rpc = request.uri().path().rsplit('/').next().unwrap_or_default();
            self.refusals.rpc(
                listener,
                "unauthenticated",
                format_args!("caller refused ({rpc}): {err}"),
            );
            self.refused.record(
                &self.audit,
                rpc,
                connection.and_then(|c| c.peer).map(|a| a.to_string()),
                &err.to_string(),
            );
            Refused::Unauthenticated(err).into()
        })
    }

    fn full(&self, listener: Listener, max: usize) -> Refused {
        let whose = match (listener, max == self.max) {
            (Listener::Tcp | Listener::Mcp, false) => {
                " from TCP callers (limits.max_in_flight less limits.in_flight_reserved_for_unix_socket)"
            }
            _ => " (limits.max_in_flight)",
        };
        self.refusals.rpc(
            listener,
            "in_flight",
            format_args!("rpc refused: the sidecar has {max} RPCs in flight{whose}"),
        );
        Refused::Exhausted(format!(
            "the sidecar has {max} calls in flight{whose}; retry shortly"
        ))
    }

    /// `body` as [`Metered`], and the request bytes it holds (given back when dropped).
    fn metered(
        self: Arc<Self>,
        body: tonic::body::Body,
        listener: Listener,
    ) -> (tonic::body::Body, BytesHeld) {
        let bytes_held = Arc::new(Mutex::new(None));
        let deadline = Instant::now() + self.body_timeout;
        let metered = tonic::body::Body::new(Metered {
            inner: body,
            bytes_held: bytes_held.clone(),
            deadline,
            timer: None,
            ended: false,
            listener,
            shared: self,
        });
        (metered, bytes_held)
    }
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for AdmissionService<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        if !request.uri().path().starts_with(LIMITED_PREFIX) {
            return Box::pin(self.inner.call(request));
        }
        let held = match self.shared.admit(&mut request, IdentifiedBy::Grpc, true) {
            Ok(held) => held,
            Err(Refusal::Refused(refused)) => {
                return Box::pin(std::future::ready(Ok(refused.status().into_http())));
            }
            Err(Refusal::Refetch(keys)) => {
                // The rare path: fetch the issuer's keys, then admit once more. The service
                // polled ready goes with the request (tower's contract); a clone stays.
                let ready = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, ready);
                let shared = self.shared.clone();
                return Box::pin(async move {
                    keys.refetch_for_unknown_key().await;
                    let held = match shared.admit_again(&mut request, IdentifiedBy::Grpc) {
                        Ok(held) => held,
                        Err(refused) => return Ok(refused.status().into_http()),
                    };
                    let (parts, body) = request.into_parts();
                    let listener = parts
                        .extensions
                        .get::<Connection>()
                        .map_or(Listener::Tcp, |c| c.listener);
                    let (body, bytes_held) = shared.clone().metered(body, listener);
                    let response = inner.call(http::Request::from_parts(parts, body)).await;
                    drop((held, bytes_held));
                    response
                });
            }
        };
        let listener = request
            .extensions()
            .get::<Connection>()
            .map_or(Listener::Tcp, |c| c.listener);
        // The request's bytes are held until its answer is sent (its decoded copy lives that long).
        let (parts, body) = request.into_parts();
        let (body, bytes_held) = self.shared.clone().metered(body, listener);
        let request = http::Request::from_parts(parts, body);
        // `map`, not an `async` block: a block would hold the inner future twice, once as
        // captured and once as awaited (rust-lang/rust#62958), ~300 bytes per call in flight.
        Box::pin(self.inner.call(request).map(move |response| {
            drop((held, bytes_held));
            response
        }))
    }
}

/// The calls in flight per tenant.
struct TenantShares {
    max: usize,
    held: Mutex<HashMap<Arc<str>, usize>>,
}

impl TenantShares {
    fn try_take(self: &Arc<Self>, tenant: &Arc<str>) -> Option<Share> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.entry(tenant.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Share {
            shares: self.clone(),
            tenant: tenant.clone(),
        })
    }
}

/// One call of a tenant's share; given back when dropped (a tenant with none left is forgotten,
/// so the map holds only tenants with calls in flight).
struct Share {
    shares: Arc<TenantShares>,
    tenant: Arc<str>,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

/// A request body that takes a share of the sidecar's request-byte budget for each frame it
/// reads, and fails with RESOURCE_EXHAUSTED when the budget has none left, or with
/// DEADLINE_EXCEEDED when it has not ended by its deadline.
/// The request bytes a body holds, shared with whoever keeps them until the answer is sent.
type BytesHeld = Arc<Mutex<Option<OwnedSemaphorePermit>>>;

struct Metered {
    inner: tonic::body::Body,
    bytes_held: BytesHeld,
    deadline: Instant,
    /// Made only when the body has to be waited for: most arrive with their headers.
    timer: Option<Pin<Box<Sleep>>>,
    ended: bool,
    listener: Listener,
    shared: Arc<Shared>,
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
            Poll::Ready(None) => {
                self.ended = true;
                return Poll::Ready(None);
            }
            Poll::Pending => return self.wait(cx),
        };
        if let Some(data) = frame.data_ref() {
            let units = u32::try_from(data.len().div_ceil(UNIT)).unwrap_or(u32::MAX);
            match self.shared.bytes.clone().try_acquire_many_owned(units) {
                Ok(permit) => {
                    let mut held = self.bytes_held.lock().unwrap_or_else(|p| p.into_inner());
                    match held.as_mut() {
                        Some(all) => all.merge(permit),
                        None => *held = Some(permit),
                    }
                }
                Err(_) => {
                    let max_bytes = self.shared.max_bytes;
                    self.shared.refusals.rpc(
                        self.listener,
                        "request_bytes",
                        format_args!(
                            "rpc refused: the sidecar holds {max_bytes} bytes of requests (limits.max_request_bytes_in_flight)"
                        ),
                    );
                    return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(format!(
                        "the sidecar holds {max_bytes} bytes of requests (limits.max_request_bytes_in_flight); retry shortly"
                    )))));
                }
            }
        }
        if self.inner.is_end_stream() {
            self.ended = true;
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

impl Metered {
    /// The body has not arrived yet: wait, until its deadline.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if self.ended {
            return Poll::Pending;
        }
        let deadline = self.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.ended = true;
        let timeout_ms = self.shared.body_timeout.as_millis();
        self.shared.refusals.rpc(
            self.listener,
            "body_timeout",
            format_args!(
                "rpc refused: a request body did not arrive within {timeout_ms} ms (limits.request_body_timeout)"
            ),
        );
        Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
            "the request's body did not arrive within {timeout_ms} ms of its headers (limits.request_body_timeout)"
        )))))
    }
}
