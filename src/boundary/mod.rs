//! The execution boundary: every tool call passes one ordered chain of stages, written top to
//! bottom in [`Boundary::chain`]. Each stage lives in its own file and returns a typed
//! [`Refusal`] naming itself; the first refusal ends the chain. Only the chain can make the
//! [`Permit`] an executor needs.
//!
//! ListTools uses the same resolve, access and scope stages, so what the model sees and what may
//! execute cannot drift apart. Stages 1–7 are one function (`policy`) that ExplainTool, catalog
//! tests and the shadow catalog run too (`explain`), reading stages 8–10's state without
//! changing it.

pub mod access;
pub mod bind;
pub mod explain;
pub mod idempotency;
mod observer;
mod permit;
mod policy;
pub mod resolve;
pub mod schema;
pub mod scopes;
pub mod structure;

use std::{
    borrow::Borrow,
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use futures::{FutureExt, StreamExt, stream};
use opentelemetry::trace::{SpanId, TraceId};
use tokio::time::Instant;

pub(crate) use observer::{CallObserver, FinishedCall};
pub use permit::Permit;

use crate::{
    approvals::{self, Approval, ApprovalState, Approvals, DecideError},
    audit::{AuditEvent, AuditLog, EventKind, EventTime, Party, Reservation},
    canonical,
    catalog::{Catalog, ToolVersion, revision_of},
    clock::SharedClock,
    error::{Reason, Refusal, Stage, Status},
    executor::{ExecError, Executors},
    identity::Caller,
    limits::Quotas,
    metrics::Metrics,
    outcome::CallOutcome,
    settings::LimitsConfig,
    settings::RiskLevel,
    state,
    telemetry::spans,
};
use idempotency::{Claimed, Idempotency};
use resolve::{Definitions, RevisionLog};

/// The catalog and the state that must change with it, swapped as one on reload.
pub struct CatalogState {
    pub catalog: Catalog,
    pub rate_limits: Quotas,
}

/// Where the state kept between calls lives: approvals, idempotency keys, and the backend the
/// rate limits of each catalog are built on.
pub struct Stores {
    pub backend: state::Backend,
    pub approvals: Approvals,
    pub idempotency: Idempotency,
}

impl Stores {
    /// The stores of `backend`, with these budgets.
    pub fn new(
        backend: state::Backend,
        clock: &SharedClock,
        approvals: approvals::Budget,
        idempotency: idempotency::Budget,
    ) -> Self {
        Stores {
            approvals: Approvals::new(&backend, clock.clone(), approvals),
            idempotency: Idempotency::new(&backend, clock.clone(), idempotency),
            backend,
        }
    }
}

/// What is common to the calls of one request.
#[derive(Debug, Clone)]
pub struct Turn {
    pub caller: Arc<Caller>,
    /// Shared, not copied, by each call's permit and audit event.
    pub run_id: Arc<str>,
    pub step: u32,
    /// The revision the model was shown, if the client says.
    pub catalog_revision: Option<String>,
    /// The client's gRPC deadline, if any.
    pub deadline: Option<Instant>,
    /// The trace context this turn's spans are children of: the caller's, whose `traceparent`
    /// is carried on to backends when spans are not exported.
    pub trace_parent: opentelemetry::Context,
}

/// One call as the model proposed it, in domain terms.
#[derive(Debug, Clone, Default)]
pub struct CallRequest {
    pub call_id: String,
    pub name: String,
    pub arguments_json: String,
    pub version: Option<String>,
    pub idempotency_key: Option<String>,
    pub approval_id: Option<String>,
}

/// The bytes of results one response may still carry. A batch's results share the gRPC message
/// limit: a result that would overflow it comes back on its own as a short `output_too_large`
/// refusal, and the others are returned, instead of the whole response failing after the calls
/// ran. Each result has room for such a refusal set aside from the start.
#[derive(Debug)]
pub struct ResponseBudget {
    left: AtomicUsize,
}

pub use crate::settings::{RESPONSE_MARGIN_BYTES, RESULT_RESERVE_BYTES};

impl ResponseBudget {
    /// The budget for `calls` results in a message of at most `max_message_bytes`.
    pub fn new(max_message_bytes: usize, calls: usize) -> Self {
        let reserved = RESPONSE_MARGIN_BYTES + calls.saturating_mul(RESULT_RESERVE_BYTES);
        ResponseBudget {
            left: AtomicUsize::new(max_message_bytes.saturating_sub(reserved)),
        }
    }

    /// Takes room for an outcome beyond its reserve, if there is enough.
    fn take(&self, outcome: &CallOutcome) -> bool {
        let refusal_text = outcome.refusal.as_ref().map_or(0, |r| {
            r.message.len() + r.detail.as_ref().map_or(0, String::len) + 64
        });
        let size = outcome.model_text.len()
            + refusal_text
            + outcome.call_id.len()
            + outcome.tool.len()
            + outcome.tool_version.len()
            + outcome.approval_id.as_ref().map_or(0, String::len)
            + 64;
        let Some(excess) = size.checked_sub(RESULT_RESERVE_BYTES) else {
            return true;
        };
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(excess)
            })
            .is_ok()
    }
}

/// Everything the chain needs, for the life of the server.
pub struct Boundary {
    state: ArcSwap<CatalogState>,
    limits: LimitsConfig,
    backend: state::Backend,
    approvals: Approvals,
    idempotency: Idempotency,
    executors: Executors,
    audit: AuditLog,
    revisions: RevisionLog,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    /// Set when the shutdown grace period is over: running calls end as CANCELLED.
    hard_stop: tokio::sync::watch::Sender<bool>,
    /// Told of every finished call (the shadow catalog's worker), once the server registers it.
    observer: std::sync::OnceLock<Arc<dyn CallObserver>>,
    /// Makes the calls' spans; off unless traces are exported.
    tracer: spans::Tracer,
    /// What the calls in flight may hold of parsed arguments.
    arguments_budget: structure::ArgumentsBudget,
}

/// What a successful chain produced.
struct Success {
    output: String,
    approval_id: Option<String>,
}

/// A call that passed stages 1-9, on its way to its backend.
struct Admitted {
    /// With the bound arguments, in canonical form: what the backend receives.
    permit: Permit,
    arguments_sha256: Arc<str>,
    approval_id: Option<String>,
    /// The arguments' share of the parsed-arguments budget (and their recorded copy's), held
    /// until the backend has answered.
    _held: (structure::ArgumentsHeld, Option<structure::ArgumentsHeld>),
}

impl Boundary {
    pub fn new(
        catalog: Catalog,
        limits: LimitsConfig,
        stores: Stores,
        executors: Executors,
        audit: AuditLog,
        clock: SharedClock,
        metrics: Arc<Metrics>,
    ) -> Self {
        let rate_limits = Quotas::build(&catalog, clock.clone(), &stores.backend, None);
        metrics.serving_revision(catalog.revision());
        let arguments_budget =
            structure::ArgumentsBudget::new(limits.max_parsed_arguments_bytes_in_flight);
        Boundary {
            state: ArcSwap::from_pointee(CatalogState {
                catalog,
                rate_limits,
            }),
            idempotency: stores.idempotency,
            revisions: RevisionLog::new(limits.revision_log_max_bytes),
            limits,
            backend: stores.backend,
            approvals: stores.approvals,
            executors,
            audit,
            clock,
            metrics,
            hard_stop: tokio::sync::watch::channel(false).0,
            observer: std::sync::OnceLock::new(),
            tracer: spans::Tracer::off(),
            arguments_budget,
        }
    }

    /// Spans for every call from now on, made by `tracer`.
    pub fn with_tracer(mut self, tracer: spans::Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// What makes the spans of calls and turns.
    pub fn tracer(&self) -> &spans::Tracer {
        &self.tracer
    }

    /// Has `observer` told of every call finished from now on; `false` if one already is.
    pub(crate) fn observe_calls(&self, observer: Arc<dyn CallObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// The catalog in force now.
    pub fn catalog(&self) -> Arc<CatalogState> {
        self.state.load_full()
    }

    pub fn executors(&self) -> &Executors {
        &self.executors
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    pub fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Where rate limits, approvals and idempotency keys live.
    pub fn state_backend(&self) -> &state::Backend {
        &self.backend
    }

    /// Bytes held by each store kept between calls, for the `toolgate_*_bytes` gauges.
    pub fn store_bytes(&self) -> StoreBytes {
        StoreBytes {
            idempotency: self.idempotency.bytes(),
            approvals: self.approvals.bytes(),
            revision_log: self.revisions.bytes(),
        }
    }

    /// Ends every running call now (CANCELLED, audited); for the end of the shutdown grace period.
    pub fn stop_calls(&self) {
        self.hard_stop.send_replace(true);
    }

    /// Calls being decided or run now.
    pub fn in_flight(&self) -> i64 {
        self.metrics.calls_in_flight()
    }

    /// Replaces the catalog. Calls already running keep the definition they started with; rate
    /// limit state carries over for unchanged quotas; open approvals of changed tools are voided.
    pub async fn replace_catalog(&self, catalog: Catalog) -> usize {
        let previous = self.state.load_full();
        let rate_limits = Quotas::build(
            &catalog,
            self.clock.clone(),
            &self.backend,
            Some(&previous.rate_limits),
        );
        let invalidated = self.approvals.invalidate_changed(&catalog).await;
        self.metrics.serving_revision(catalog.revision());
        self.state.store(Arc::new(CatalogState {
            catalog,
            rate_limits,
        }));
        invalidated
    }

    /// The tools this caller's model may see, sorted by name, and their revision.
    pub fn list_tools(&self, caller: &Caller) -> (Vec<Arc<ToolVersion>>, String) {
        let state = self.state.load();
        let visible = visible_tools(&state.catalog, caller);
        let revision = revision_of(visible.iter().map(|t| t.as_ref()));
        self.revisions.record(&revision, || definitions(&visible));
        (visible, revision)
    }

    /// Runs the calls of one model turn; results come back in the order of `calls`, and together
    /// fit in one response.
    pub async fn execute_batch(
        &self,
        turn: &Turn,
        calls: Vec<CallRequest>,
        parallel: bool,
        max_parallel: usize,
    ) -> Vec<CallOutcome> {
        let cap = match max_parallel {
            0 => self.limits.max_parallel,
            n => n.min(self.limits.max_parallel),
        };
        let budget = ResponseBudget::new(self.limits.max_message_bytes, calls.len());
        let calls = calls
            .into_iter()
            .enumerate()
            .map(|(index, call)| self.execute(turn, call, index, &budget));
        if parallel && cap > 1 {
            // `buffered` runs up to `cap` at once and yields in input order.
            stream::iter(calls).buffered(cap).collect().await
        } else {
            stream::iter(calls).then(|call| call).collect().await
        }
    }

    /// Runs one call through the chain and records its audit event, whatever ends it: the
    /// event's queue slot is taken before anything happens, and the event goes into it also when
    /// the call is cancelled, panics or is stopped at shutdown.
    ///
    /// Not an `async fn`: one copies its arguments into locals, so the call's request would be
    /// held twice for as long as the call runs. The block below uses them in place.
    ///
    /// The turn and the budget are borrowed by a batch's calls and owned by a single call's
    /// future, which then holds nothing else.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub fn execute<'a, T, B>(
        &'a self,
        turn: T,
        call: CallRequest,
        index: usize,
        budget: B,
    ) -> impl Future<Output = CallOutcome> + Send + 'a
    where
        T: Borrow<Turn> + Send + Sync + 'a,
        B: Borrow<ResponseBudget> + Send + Sync + 'a,
    {
        async move {
            let turn: &Turn = turn.borrow();
            let started = Instant::now();
            let _in_flight = self.metrics.in_flight();
            // What the call's audit event is made of; the event is built when the call ends.
            // Without a queue slot, it sends nothing.
            let mut guard = AuditGuard {
                turn,
                call_id: structure::reported_call_id(
                    &structure::normalize_call_id(&call.call_id, turn.step, index),
                    self.limits.max_identifier_bytes,
                ),
                tool: structure::reported_call_id(&call.name, self.limits.max_identifier_bytes),
                time: EventTime(self.clock.unix_ms()),
                trace: None,
                started,
                trail: CallTrail::default(),
                reservation: None,
            };
            let mut span = spans::execute_tool(&self.tracer, &guard.tool, &turn.trace_parent);
            guard.trace = spans::ids(&span);
            // The event's slot comes first. Fail closed: a call that could not be audited does not
            // run. Otherwise wait for room: backpressure acts before anything happens.
            guard.reservation = match self.audit.fail_closed() {
                true => self.audit.try_reserve(),
                false => self.audit.reserve().await,
            };
            if guard.reservation.is_none() {
                tracing::error!(tool = %call.name, call_id = %guard.call_id, "audit queue full: call refused (fail-closed)");
                let refusal = Refusal::new(
                    Stage::Structure,
                    Reason::AuditUnavailable,
                    "the audit log cannot keep up; the call was not run",
                );
                let call_id = guard.call_id.to_string();
                let mut outcome = CallOutcome::refused(call_id, call.name, String::new(), refusal);
                outcome.duration = started.elapsed();
                spans::record_call(&mut span, &turn.caller, guard.names(), None, &outcome);
                self.metrics.observe(&outcome, None);
                return outcome;
            }
            let mut hard_stop = self.hard_stop.subscribe();
            let chain =
                AssertUnwindSafe(self.chain(turn, &call, &guard.call_id, &mut guard.trail, &span))
                    .catch_unwind();
            let result = tokio::select! {
                result = chain => result.unwrap_or_else(|panic| {
                    tracing::error!(tool = %call.name, call_id = %guard.call_id, panic = panic_message(&panic), "a call panicked; this is a bug in toolgate");
                    Err(Refusal::new(Stage::Execute, Reason::Internal, "internal error in toolgate; the call's outcome is unknown"))
                }),
                _ = hard_stop.wait_for(|stop| *stop) => Err(Refusal::new(
                    Stage::Execute,
                    Reason::Cancelled,
                    "the sidecar is shutting down",
                )),
            };
            let trail = &guard.trail;
            let call_id = guard.call_id.to_string();
            let mut outcome = match result {
                Ok(success) => {
                    let mut outcome = CallOutcome::ok(
                        call_id,
                        call.name,
                        trail.tool_version().to_owned(),
                        success.output,
                    );
                    outcome.approval_id = success.approval_id;
                    outcome
                }
                Err(refusal) => {
                    let version = trail.tool_version().to_owned();
                    CallOutcome::refused(call_id, call.name, version, refusal)
                }
            };
            if !budget.borrow().take(&outcome) {
                outcome = over_budget(outcome);
            }
            outcome.duration = started.elapsed();
            outcome.idempotent_replay = trail.idempotent_replay;
            spans::record_call(
                &mut span,
                &turn.caller,
                guard.names(),
                trail.tool.as_deref(),
                &outcome,
            );
            let known = !outcome.tool_version.is_empty()
                || self.state.load().catalog.contains(&outcome.tool);
            self.metrics.observe(&outcome, known.then_some(&guard.tool));
            if let Some(arguments) = &trail.arguments {
                spans::record_content(&mut span, arguments, &outcome);
            }
            // An observer (the shadow candidate) decides the same call later, off the response
            // path.
            if let Some(observer) = self.observer.get().filter(|o| o.wants_calls()) {
                observer.finished(FinishedCall {
                    turn,
                    index,
                    request: CallRequest {
                        call_id: call.call_id,
                        name: outcome.tool.clone(),
                        arguments_json: call.arguments_json,
                        version: call.version,
                        idempotency_key: call.idempotency_key,
                        approval_id: call.approval_id,
                    },
                    outcome: &outcome,
                    trail,
                });
            }
            guard.finish(&outcome);
            outcome
        }
    }

    /// The ordered chain. Each line is one stage; the first refusal returns.
    async fn chain(
        &self,
        turn: &Turn,
        call: &CallRequest,
        call_id: &Arc<str>,
        trail: &mut CallTrail,
        span: &spans::ToolgateSpan,
    ) -> Result<Success, Refusal> {
        // The catalog is pinned for the rest of this call, even if a reload happens meanwhile.
        let state = self.state.load_full();
        // 1-9 run in a future of their own, so what they hold is gone while the backend runs.
        let admitted = self.admit(&state, turn, call, call_id, trail).await?;
        // 10-12.
        self.dispatch(turn, call, admitted, trail, span).await
    }

    /// Stages 1-9: everything decided before the backend is called.
    async fn admit(
        &self,
        state: &CatalogState,
        turn: &Turn,
        call: &CallRequest,
        call_id: &Arc<str>,
        trail: &mut CallTrail,
    ) -> Result<Admitted, Refusal> {
        let caller = &turn.caller;
        let catalog = &state.catalog;
        // 1-7. Structure, tool and version, allow/deny lists, scopes, schema, bound arguments
        // and the canonical form: decided from the call, the caller and the catalog alone, by
        // the same function ExplainTool runs (`policy.rs`).
        let mut seen = policy::Seen::default();
        let shown = turn
            .catalog_revision
            .as_deref()
            .map(|shown| (&self.revisions, shown));
        let decided = policy::decide(
            &self.limits,
            &self.arguments_budget,
            catalog,
            shown,
            caller,
            call,
            &mut seen,
        );
        trail.tool = seen.tool.cloned();
        trail.bound_override_attempts = seen.override_attempts;
        let policy::Decided {
            tool,
            arguments,
            arguments_sha256,
            held,
        } = decided?;
        trail.arguments_sha256 = Some(arguments_sha256.clone());
        // A recorded copy of the arguments lives as long as the call: it is charged too.
        let record_held = match tool.record_arguments {
            true => {
                let held = self.arguments_budget.take(held.bytes())?;
                trail.arguments = Some(Box::new(redact(&arguments, &tool.redact)));
                Some(held)
            }
            false => None,
        };
        // 8. Rate limits: both quotas, or neither.
        let tenant_rate = catalog
            .tenants
            .get(&*caller.tenant)
            .and_then(|t| t.rate_limit);
        state
            .rate_limits
            .check(&caller.tenant, tool, tenant_rate)
            .await?;
        // 9. Approval for risky tools, bound to these exact arguments; used up only when the
        // call reaches its backend.
        // Boxed: only the tools that need approval pay for the stage's state.
        let approval = if tool.requires_approval {
            Some(Box::pin(self.approval(turn, call, tool, &arguments, &arguments_sha256)).await?)
        } else {
            None
        };
        trail.approval_id = approval.as_ref().map(|a| a.id.clone());
        if let Some(checked) = &approval
            && checked.already_used
            && call.idempotency_key.is_none()
        {
            return Err(Refusal::new(
                Stage::Approval,
                Reason::ApprovalAlreadyUsed,
                format!("approval {} was already used", checked.id),
            )
            .with_approval_id(checked.id.clone()));
        }
        Ok(Admitted {
            permit: Permit::new(
                call_id.clone(),
                turn.run_id.clone(),
                tool.clone(),
                caller.clone(),
                arguments,
            ),
            arguments_sha256,
            approval_id: approval.map(|a| a.id),
            _held: (held, record_held),
        })
    }

    /// Stages 10-12: idempotency, wrapping the execution under the deadline and the result's
    /// checks. Like `execute`, a block that uses its arguments in place: a slow call waits here.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    fn dispatch<'a>(
        &'a self,
        turn: &'a Turn,
        call: &'a CallRequest,
        mut admitted: Admitted,
        trail: &'a mut CallTrail,
        span: &'a spans::ToolgateSpan,
    ) -> impl Future<Output = Result<Success, Refusal>> + Send + 'a {
        async move {
            // Set when the call is handed to its backend: from then on, its effects are unknown
            // until it answers.
            let started = AtomicBool::new(false);
            let approval_id = admitted.approval_id.as_deref();
            // 10. Idempotency, wrapping 11-12: execute under the deadline and shape the result.
            // The keyed path is boxed: only calls that use it pay for its state.
            let output = match call.idempotency_key.as_deref() {
                None => {
                    self.call_backend(turn, span, &mut admitted.permit, approval_id, &started)
                        .await
                }
                Some(key) => {
                    Box::pin(async {
                        let tool = admitted.permit.tool();
                        let key = policy::idempotency_key(&turn.caller, tool, key);
                        // A duplicate waits for a running first call at most as long as that
                        // call may run, and never past its own client's deadline.
                        let lease = tool.timeout + idempotency::redis::LEASE_MARGIN;
                        let now = Instant::now();
                        let wait_until = turn
                            .deadline
                            .map_or(now + tool.timeout, |d| d.min(now + tool.timeout));
                        match self
                            .idempotency
                            .claim(
                                key,
                                &admitted.arguments_sha256,
                                tool.risk_level,
                                &tool.version,
                                &started,
                                lease,
                                wait_until,
                            )
                            .await?
                        {
                            Claimed::Replay(stored) => {
                                trail.idempotent_replay = true;
                                trail.replayed_version = Some(stored.tool_version);
                                stored.result
                            }
                            Claimed::Owner(slot) => {
                                let result = self
                                    .call_backend(
                                        turn,
                                        span,
                                        &mut admitted.permit,
                                        approval_id,
                                        &started,
                                    )
                                    .await;
                                slot.finish(&result).await;
                                result
                            }
                        }
                    })
                    .await
                }
            }?;
            // Named whole, so the block owns all of it (its share of the parsed-arguments
            // budget too) until the backend has answered: a block captures only what it names.
            drop(admitted);
            Ok(Success {
                output,
                approval_id: trail.approval_id.clone(),
            })
        }
    }

    /// Calls the backend inside its CLIENT span, whose context is what the backend receives as
    /// `traceparent`.
    fn call_backend<'a>(
        &'a self,
        turn: &Turn,
        call_span: &spans::ToolgateSpan,
        permit: &'a mut Permit,
        approval_id: Option<&'a str>,
        started: &'a AtomicBool,
    ) -> impl Future<Output = Result<String, Refusal>> + Send + 'a {
        let tool = permit.tool();
        let span = spans::backend_call(&self.tracer, tool, call_span, &turn.trace_parent);
        let traceparent = spans::outbound_traceparent(&span, tool, &turn.trace_parent);
        permit.set_traceparent(traceparent);
        self.run(permit, span, turn.deadline, approval_id, started)
    }

    /// Stage 9, for a tool that requires approval: creates an approval for a first call, or
    /// checks the one the call redeems.
    async fn approval(
        &self,
        turn: &Turn,
        call: &CallRequest,
        tool: &ToolVersion,
        arguments: &serde_json::Value,
        arguments_sha256: &str,
    ) -> Result<approvals::Checked, Refusal> {
        let binding = policy::approval_binding(&turn.caller, &turn.run_id, tool, arguments_sha256);
        let refuse =
            |(reason, message): (Reason, String)| Refusal::new(Stage::Approval, reason, message);
        match call
            .approval_id
            .as_deref()
            .filter(|id| !id.trim().is_empty())
        {
            None => {
                let approval = self
                    .approvals
                    .create(binding, canonical::to_string(arguments), tool.risk_level)
                    .await
                    .map_err(refuse)?;
                Err(Refusal::new(
                    Stage::Approval,
                    Reason::ApprovalRequired,
                    format!(
                        "{} needs approval; an approver must approve {} before the call is repeated with that approval_id",
                        tool.name, approval.id
                    ),
                )
                .with_approval_id(approval.id))
            }
            Some(id) => match self.approvals.check(id, &binding).await {
                Ok(checked) => Ok(checked),
                Err(err) => Err(refuse(err).with_approval_id(id)),
            },
        }
    }

    /// Stages 11 and 12: run under min(tool timeout, client deadline), then check the output.
    /// An approval is used up here, as the call is handed to the backend, and given back if the
    /// backend was never reached. The backend's span (`span`) ends, with its end time, when the
    /// backend answers or the call is dropped.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    fn run<'a>(
        &'a self,
        permit: &'a Permit,
        span: spans::ToolgateSpan,
        deadline: Option<Instant>,
        approval_id: Option<&'a str>,
        started: &'a AtomicBool,
    ) -> impl Future<Output = Result<String, Refusal>> + Send + 'a {
        async move {
            let _span = &span;
            let tool = permit.tool();
            let now = Instant::now();
            // A timeout of up to 30 days (validated at load) cannot overflow; saturate regardless.
            let tool_deadline = now
                .checked_add(tool.timeout)
                .unwrap_or(now + crate::settings::MAX_DURATION);
            let deadline = deadline.map_or(tool_deadline, |d| d.min(tool_deadline));
            // Beyond a tool's concurrency cap, refuse at once rather than queue without bound.
            let _slot = match &tool.concurrency {
                Some(cap) => Some(cap.clone().try_acquire_owned().map_err(|_| {
                    Refusal::new(
                        Stage::Execute,
                        Reason::Overloaded,
                        format!(
                            "{} is at its limit of calls in flight; retry shortly",
                            tool.name
                        ),
                    )
                })?),
                None => None,
            };
            let tenant = &permit.caller().tenant;
            if let Some(id) = approval_id {
                self.approvals
                    .consume(tenant, id)
                    .await
                    .map_err(|(reason, message)| {
                        Refusal::new(Stage::Approval, reason, message).with_approval_id(id)
                    })?;
            }
            let executor = self.executors.for_spec(&tool.executor);
            tracing::debug!(call_id = permit.call_id(), tool = %tool.name, "executing");
            started.store(true, Ordering::Release);
            let output = match tokio::time::timeout_at(deadline, executor.execute(permit)).await {
                Ok(Ok(output)) => output,
                Ok(Err(err)) => {
                    if !err.reached_backend() {
                        started.store(false, Ordering::Release);
                        if let Some(id) = approval_id {
                            self.approvals.release(tenant, id).await;
                        }
                    }
                    return Err(exec_refusal(err, permit));
                }
                Err(_elapsed) => return Err(timeout_refusal(tool, deadline == tool_deadline)),
            };
            if output.len() > tool.max_output_bytes {
                return Err(Refusal::new(
                    Stage::Result,
                    Reason::OutputTooLarge,
                    format!(
                        "the tool's output is {} bytes; the limit is {}",
                        output.len(),
                        tool.max_output_bytes
                    ),
                ));
            }
            Ok(output)
        }
    }

    /// One page of the approvals of the approver's tenant.
    pub async fn list_approvals(
        &self,
        approver: &Caller,
        state: Option<ApprovalState>,
        page_size: usize,
        after: Option<&approvals::Cursor>,
    ) -> Result<approvals::Page, DecideError> {
        self.approvals.list(approver, state, page_size, after).await
    }

    /// One approval of the approver's tenant, with its full arguments.
    pub async fn get_approval(&self, approver: &Caller, id: &str) -> Result<Approval, DecideError> {
        self.approvals.get(approver, id).await
    }

    /// Approves or rejects, and records the decision in the audit trail. The event's slot is
    /// taken before the decision is applied, so an applied decision always has its event.
    pub async fn decide_approval(
        &self,
        approver: &Caller,
        id: &str,
        approve: Option<bool>,
        reason: &str,
    ) -> Result<Approval, DecideError> {
        let approve = approve.ok_or(DecideError::NoDecision)?;
        let Some(slot) = (match self.audit.fail_closed() {
            true => self.audit.try_reserve(),
            false => self.audit.reserve().await,
        }) else {
            return Err(DecideError::AuditUnavailable);
        };
        let approval = self.approvals.decide(approver, id, approve, reason).await?;
        slot.send(Box::new(AuditEvent {
            time: EventTime(self.clock.unix_ms()),
            kind: Some(EventKind::ApprovalDecision),
            run_id: approval.binding.run_id.as_str().into(),
            party: Party::Named {
                tenant: approval.binding.tenant.clone(),
                subject: approval.binding.subject.clone(),
                agent: approval.binding.agent.clone(),
            },
            tool: approval.binding.tool.as_str().into(),
            tool_version: approval.binding.tool_version.as_str().into(),
            risk_level: Some(approval.risk_level.as_str()),
            arguments_sha256: Some(approval.binding.arguments_sha256.as_str().into()),
            status: if approve { "APPROVED" } else { "REJECTED" },
            reason: Some(reason.to_owned()).filter(|r| !r.is_empty()),
            approval_id: Some(approval.id.clone()),
            approver: Some(approver.subject.clone()),
            ..AuditEvent::default()
        }));
        Ok(approval)
    }

    /// Approvals waiting for a decision.
    pub fn pending_approvals(&self) -> usize {
        self.approvals.pending()
    }
}

/// Bytes held by the stores kept between calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreBytes {
    pub idempotency: usize,
    pub approvals: usize,
    pub revision_log: usize,
}

/// An outcome that does not fit in what is left of the response.
fn over_budget(outcome: CallOutcome) -> CallOutcome {
    let size = outcome.model_text.len();
    let message = match outcome.status {
        Status::Ok => format!(
            "the tool ran, but its output ({size} bytes) does not fit in what is left of this response; it was not returned — call it on its own (with an idempotency key, the repeat returns the stored result)"
        ),
        status => format!(
            "the call ended {} ({}), but its result ({size} bytes) does not fit in what is left of this response — call it on its own to see it",
            status.as_str(),
            outcome.refusal.as_ref().map_or("", |r| r.reason.code()),
        ),
    };
    let refusal = Refusal::new(Stage::Result, Reason::OutputTooLarge, message);
    let mut refused =
        CallOutcome::refused(outcome.call_id, outcome.tool, outcome.tool_version, refusal);
    refused.approval_id = outcome.approval_id;
    refused
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Most bytes of a backend's own error text passed on (to the model, and to records that may
/// carry it).
const MAX_DETAIL_BYTES: usize = 1024;

/// A backend failure as a refusal. The backend's own text goes to the caller; records carry it
/// only for tools that record their arguments, with the `redact` values taken out.
fn exec_refusal(err: ExecError, permit: &Permit) -> Refusal {
    // A write that may have reached its backend may have written, as one that timed out may have:
    // not retryable, so an idempotency key keeps the result and its retry cannot write twice.
    let outcome_unknown = err.outcome_unknown() && permit.tool().risk_level != RiskLevel::ReadOnly;
    let (reason, message, detail) = match err {
        ExecError::Failed { message, detail } => (Reason::ToolFailed, message, detail),
        ExecError::Unavailable(m) | ExecError::NotReached(m) => {
            (Reason::UpstreamUnavailable, m, None)
        }
        ExecError::Overloaded(m) => (Reason::Overloaded, m, None),
        ExecError::Refused(m) => (Reason::DestinationRefused, m, None),
        ExecError::Misconfigured(m) => (Reason::BackendMisconfigured, m, None),
        ExecError::OutputTooLarge(m) => (Reason::OutputTooLarge, m, None),
    };
    let stage = match reason {
        Reason::OutputTooLarge => Stage::Result,
        _ => Stage::Execute,
    };
    let mut refusal = Refusal::new(stage, reason, message);
    if outcome_unknown {
        refusal
            .message
            .push_str("; the outcome is unknown and changes may have been made");
        refusal = refusal.with_retryable(false);
    }
    if let Some(detail) = detail {
        let detail = truncate_utf8(detail.trim(), MAX_DETAIL_BYTES).to_owned();
        let tool = permit.tool();
        if tool.record_arguments {
            refusal.recorded_detail = Some(redact_text(&detail, permit.arguments(), &tool.redact));
        }
        refusal.detail = Some(detail);
    }
    refusal
}

/// The longest prefix of `text` within `max` bytes that ends on a character boundary.
pub(crate) fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// Free text (a backend's error) with every value found at the `redact` pointers replaced, so a
/// redacted argument echoed back by the backend is not recorded either.
fn redact_text(text: &str, arguments: &serde_json::Value, pointers: &[String]) -> String {
    fn leaves(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::String(s) if !s.is_empty() => out.push(s.clone()),
            serde_json::Value::Number(n) => out.push(n.to_string()),
            serde_json::Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
            serde_json::Value::Object(map) => map.values().for_each(|v| leaves(v, out)),
            _ => {}
        }
    }
    let mut secrets = Vec::new();
    for pointer in pointers {
        if let Some(value) = arguments.pointer(pointer) {
            leaves(value, &mut secrets);
        }
    }
    // Longest first, so a secret containing another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.to_owned();
    for secret in secrets {
        text = text.replace(&secret, "[redacted]");
    }
    text
}

/// A copy of the arguments with the values at these JSON pointers replaced.
fn redact(arguments: &serde_json::Value, pointers: &[String]) -> serde_json::Value {
    let mut copy = arguments.clone();
    for pointer in pointers {
        if let Some(value) = copy.pointer_mut(pointer) {
            *value = serde_json::Value::from("[redacted]");
        }
    }
    copy
}

fn timeout_refusal(tool: &ToolVersion, tool_timeout_hit: bool) -> Refusal {
    let limit = if tool_timeout_hit {
        format!("its timeout of {} ms", tool.timeout.as_millis())
    } else {
        "the client's deadline".to_owned()
    };
    if tool.risk_level == RiskLevel::ReadOnly {
        Refusal::new(
            Stage::Execute,
            Reason::Timeout,
            format!("{} did not finish within {limit}", tool.name),
        )
    } else {
        // A write may have happened before the deadline: retrying blindly could repeat it.
        Refusal::new(
            Stage::Execute,
            Reason::Timeout,
            format!("{} did not finish within {limit}; the outcome is unknown and changes may have been made", tool.name),
        )
        .with_retryable(false)
    }
}

/// The tools a caller may see: resolved for its tenant, allowed, and within its scopes.
fn visible_tools(catalog: &Catalog, caller: &Caller) -> Vec<Arc<ToolVersion>> {
    catalog
        .names()
        .filter_map(|name| visibility(catalog, caller, name).ok())
        .cloned()
        .collect()
}

/// Whether a caller's model sees `name` (the version it would see), or the refusal of the first
/// of resolve, access and scopes that hides it. The one definition of visibility: ListTools and
/// `toolgate explain --list` both use it.
pub(crate) fn visibility<'c>(
    catalog: &'c Catalog,
    caller: &Caller,
    name: &str,
) -> Result<&'c Arc<ToolVersion>, Refusal> {
    let tool = resolve::resolve(catalog, name, None, caller)?;
    access::check(catalog, caller, &tool.name)?;
    scopes::check(caller, tool)?;
    Ok(tool)
}

fn definitions(visible: &[Arc<ToolVersion>]) -> Definitions {
    visible
        .iter()
        .map(|t| (t.name.clone(), t.definition_hash.clone()))
        .collect()
}

fn current_revision(catalog: &Catalog, caller: &Caller) -> (String, Definitions) {
    let visible = visible_tools(catalog, caller);
    (
        revision_of(visible.iter().map(|t| t.as_ref())),
        definitions(&visible),
    )
}

/// What the stages learn about a call on the way, for its audit event (and the shadow
/// comparison), also when a later stage refuses.
#[derive(Debug, Default)]
pub(crate) struct CallTrail {
    /// The tool the call resolved to, once it did.
    pub tool: Option<Arc<ToolVersion>>,
    /// The version an idempotent replay's stored result was made by.
    pub replayed_version: Option<String>,
    /// Bound argument paths the model tried to set itself.
    pub bound_override_attempts: Vec<String>,
    pub arguments_sha256: Option<Arc<str>>,
    /// Only for tools with `record_arguments: true`, redacted (boxed: few tools record them).
    pub arguments: Option<Box<serde_json::Value>>,
    pub approval_id: Option<String>,
    pub idempotent_replay: bool,
}

impl CallTrail {
    /// The version to report: a replay's stored one, else the resolved tool's ("" if none).
    pub fn tool_version(&self) -> &str {
        match (&self.replayed_version, &self.tool) {
            (Some(version), _) => version,
            (None, Some(tool)) => &tool.version,
            (None, None) => "",
        }
    }

    /// [`Self::tool_version`], shared with the catalog when it is the resolved tool's.
    fn shared_tool_version(&self) -> Arc<str> {
        match (&self.replayed_version, &self.tool) {
            (None, Some(tool)) => tool.version.clone(),
            _ => self.tool_version().into(),
        }
    }
}

/// Holds a call's queue slot and what its audit event is made of; the event is built and sent
/// when the call finishes, or by `Drop` when the call's future is dropped (client cancel,
/// deadline, shutdown): then it says CANCELLED (or INTERNAL during a panic). Nothing of the
/// event is built before then: the identity and the turn are borrowed, not copied, so a call
/// waiting on its backend holds little more than the trail.
struct AuditGuard<'t> {
    turn: &'t Turn,
    /// As reported (numbered when blank, cut when long).
    call_id: Arc<str>,
    /// As the client named it, cut to the identifier limit.
    tool: Arc<str>,
    time: EventTime,
    /// Trace and span ids, as `spans::ids` gives them.
    trace: Option<([u8; 16], [u8; 8])>,
    started: Instant,
    trail: CallTrail,
    reservation: Option<Reservation>,
}

impl AuditGuard<'_> {
    /// The call's id and tool name as recorded, for its span.
    fn names(&self) -> spans::CallNames<'_> {
        spans::CallNames {
            call_id: &self.call_id,
            tool: &self.tool,
        }
    }

    fn finish(mut self, outcome: &CallOutcome) {
        self.send(
            outcome.status,
            outcome.refusal.as_ref(),
            outcome.duration,
            outcome.approval_id.as_ref(),
        );
    }

    fn send(
        &mut self,
        status: Status,
        refusal: Option<&Refusal>,
        duration: Duration,
        approval_id: Option<&String>,
    ) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let trail = std::mem::take(&mut self.trail);
        let tool_version = trail.shared_tool_version();
        let risk_level = trail.tool.as_ref().map(|tool| tool.risk_level.as_str());
        let approval_id = trail
            .approval_id
            .or_else(|| refusal.and_then(|r| r.approval_id.clone()))
            .or_else(|| approval_id.cloned());
        reservation.send(Box::new(AuditEvent {
            time: self.time,
            kind: Some(EventKind::ToolCall),
            call_id: self.call_id.clone(),
            run_id: self.turn.run_id.clone(),
            step: self.turn.step,
            party: Party::Caller(self.turn.caller.clone()),
            tool: self.tool.clone(),
            tool_version,
            risk_level,
            arguments_sha256: trail.arguments_sha256,
            status: status.as_str(),
            error_type: refusal.map(|r| r.reason.code()),
            refused_by: refusal.map(|r| r.stage.as_str()),
            reason: refusal.map(|r| r.text_for_record().into_owned()),
            approval_id,
            idempotent_replay: trail.idempotent_replay,
            bound_override_attempts: trail.bound_override_attempts,
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            trace_id: self
                .trace
                .map(|(trace_id, _)| TraceId::from_bytes(trace_id)),
            span_id: self.trace.map(|(_, span_id)| SpanId::from_bytes(span_id)),
            arguments: trail.arguments.map(|arguments| *arguments),
            ..AuditEvent::default()
        }));
    }
}

impl Drop for AuditGuard<'_> {
    fn drop(&mut self) {
        if self.reservation.is_none() {
            return;
        }
        let refusal = if std::thread::panicking() {
            Refusal::new(
                Stage::Execute,
                Reason::Internal,
                "internal error in toolgate; the call's outcome is unknown",
            )
        } else {
            Refusal::new(
                Stage::Execute,
                Reason::Cancelled,
                "the client cancelled the call",
            )
        };
        let duration = self.started.elapsed();
        self.send(refusal.status(), Some(&refusal), duration, None);
    }
}
