//! The execution boundary: every tool call passes one ordered chain of stages, written top to
//! bottom in [`Boundary::chain`]. Each stage lives in its own file and returns a typed
//! [`Refusal`] naming itself; the first refusal ends the chain. Only the chain can make the
//! [`Permit`] an executor needs.
//!
//! ListTools uses the same resolve, access and scope stages, so what the model sees and what may
//! execute cannot drift apart. Stages 1–7 are one function (`policy`) that ExplainTool, catalog
//! tests and the shadow catalog run too (`explain`), reading stages 8–10's state without
//! changing it.
//!
//! | # | stage | file | its store |
//! |---|---|---|---|
//! | 1–2 | structure | `structure.rs` | — |
//! | 3 | resolve | `resolve.rs` | — |
//! | 4 | access | `access.rs` | — |
//! | 5 | scopes | `scopes.rs` | — |
//! | 6 | schema | `schema.rs` | — |
//! | 7 | bind | `bind.rs` | — |
//! | 7b | flow rules | `flow.rs` | `crate::flow` (memory, Redis) |
//! | 8 | rate limit | `rate_limit.rs` | `crate::limits` (memory, Redis) |
//! | 9 | approval | `approval.rs` | `crate::approvals` (memory, Redis) |
//! | 10 | idempotency | `idempotency/` | its own (memory, Redis) |
//! | 11 | execute | `execute.rs` | — |
//! | 12 | result | `result.rs` | — |
//! | 12b | output guard | `output_guard.rs` | — |
//!
//! Beside them: the call's record (`trail.rs`), what ListTools shows (`visibility.rs`), redaction
//! (`redaction.rs`), the approvals RPCs (`approvals_admin.rs`), the sealed `Permit`, the observer
//! of finished calls, explanation, pinned MCP tools' changes at catalog swaps (`pins.rs`), and
//! the boundary's metrics (`metrics.rs`).

// The stages (see the table).
pub mod access;
mod approval;
pub mod bind;
mod execute;
mod flow;
pub mod idempotency;
mod rate_limit;
pub mod resolve;
mod result;
pub mod schema;
pub mod scopes;
pub mod structure;

// What the chain is made of and what it makes.
mod approvals_admin;
mod controls_admin;
mod emergency;
pub mod explain;
mod metrics;
mod observer;
pub mod output_guard;
mod permit;
mod pins;
mod policy;
mod redaction;
mod trail;
mod visibility;

use std::{
    borrow::Borrow,
    panic::AssertUnwindSafe,
    sync::{Arc, atomic::AtomicBool},
};

use arc_swap::ArcSwap;
use futures::{FutureExt, StreamExt, stream};
use tokio::time::Instant;

pub use approval::condition_location as approval_condition_location;
pub(crate) use observer::{CallObserver, FinishedCall};
pub use permit::Permit;
pub use rate_limit::cost_location as quota_cost_location;
pub use result::ResponseBudget;
use trail::AuditGuard;
pub(crate) use trail::CallTrail;
pub(crate) use visibility::visibility;

use crate::{
    approvals::{self, Approvals},
    audit::{AuditLog, EventTime},
    catalog::Catalog,
    clock::SharedClock,
    emergency::EmergencyDenies,
    error::{Reason, Refusal, Stage},
    executor::Executors,
    identity::Caller,
    identity::Door,
    limits::{Quotas, metrics::QuotaMetrics},
    metrics::Metrics,
    outcome::CallOutcome,
    settings::LimitsConfig,
    state,
    tasks::Tasks,
    telemetry::spans,
};
use idempotency::{Claimed, Idempotency};
use metrics::BoundaryMetrics;
use resolve::RevisionLog;

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
    pub emergency: Arc<EmergencyDenies>,
    pub flow: crate::flow::FlowStore,
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
            emergency: Arc::new(EmergencyDenies::on(&backend, clock.clone())),
            flow: crate::flow::FlowStore::on(&backend, clock.clone()),
            backend,
        }
    }
}

/// What is common to the calls of one request.
#[derive(Debug, Clone)]
pub struct Turn {
    pub caller: Arc<Caller>,
    /// The door the request came in by.
    pub door: Door,
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

/// What a door knows of a request before its calls: made into a [`Turn`] by [`Turn::new`],
/// which every door calls, so each identifier is checked once, alike.
pub struct TurnFields<'a> {
    pub caller: Arc<Caller>,
    pub door: Door,
    pub run_id: &'a str,
    pub step: u32,
    /// The revision the model was shown; blank is none.
    pub catalog_revision: Option<&'a str>,
    pub deadline: Option<Instant>,
    pub trace_parent: opentelemetry::Context,
}

/// A request-level identifier that refuses the whole request, before any call: the door
/// answers it as its protocol's malformed request (gRPC `INVALID_ARGUMENT`, JSON-RPC invalid
/// params).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadTurn(pub String);

impl Turn {
    /// The turn of a request: `run_id` and `catalog_revision` printable and within
    /// `limits.max_identifier_bytes`, a blank revision none.
    pub fn new(fields: TurnFields<'_>, limits: &LimitsConfig) -> Result<Turn, BadTurn> {
        let TurnFields {
            caller,
            door,
            run_id,
            step,
            catalog_revision,
            deadline,
            trace_parent,
        } = fields;
        for (field, value) in [
            ("run_id", run_id),
            ("catalog_revision", catalog_revision.unwrap_or_default()),
        ] {
            structure::check_identifier(field, value, limits.max_identifier_bytes)
                .map_err(|(_, message)| BadTurn(message))?;
        }
        Ok(Turn {
            caller,
            door,
            run_id: run_id.into(),
            step,
            catalog_revision: catalog_revision
                .filter(|revision| !revision.trim().is_empty())
                .map(str::to_owned),
            deadline,
            trace_parent,
        })
    }
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

/// Everything the chain needs, for the life of the server. Its parts stay its own: whoever built
/// them (the server) keeps its own handles to the ones it also needs.
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
    metrics: BoundaryMetrics,
    /// Counts what the rate limits of each catalog decide.
    quota_metrics: QuotaMetrics,
    /// The calls being decided or run: counted here, by their owner, and told to stop when the
    /// shutdown grace period is over (they end as CANCELLED).
    calls: Tasks,
    /// Bumped each time the catalog is replaced, for whoever announces changes (the MCP door).
    catalog_changes: tokio::sync::watch::Sender<u64>,
    /// Told of every finished call (the shadow catalog's worker), once the server registers it.
    observer: std::sync::OnceLock<Arc<dyn CallObserver>>,
    /// Makes the calls' spans; off unless traces are exported.
    tracer: spans::Tracer,
    /// What the calls in flight may hold of parsed arguments.
    arguments_budget: structure::ArgumentsBudget,
    /// How pinned MCP tools were last listed, to audit each change once.
    pins: pins::PinWatch,
    /// The operators' emergency denies in force.
    emergency: Arc<EmergencyDenies>,
    /// What each flow scope has seen.
    flow: crate::flow::FlowStore,
    /// Where evaluations of conditions that can take long run.
    apart: crate::conditions::Apart,
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
        metrics: &Metrics,
    ) -> Self {
        let registry = metrics;
        let metrics = BoundaryMetrics::register(registry);
        let quota_metrics = QuotaMetrics::register(registry);
        let rate_limits = Quotas::build(
            &catalog,
            clock.clone(),
            &stores.backend,
            &quota_metrics,
            None,
        );
        metrics.serving_revision(catalog.revision());
        let arguments_budget =
            structure::ArgumentsBudget::new(limits.max_parsed_arguments_bytes_in_flight);
        let calls = Tasks::new();
        // Running calls wait once, for the hard stop or a deny stopping them.
        stores.emergency.attach(calls.token());
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
            quota_metrics,
            calls,
            catalog_changes: tokio::sync::watch::Sender::new(0),
            observer: std::sync::OnceLock::new(),
            tracer: spans::Tracer::off(),
            arguments_budget,
            pins: pins::PinWatch::default(),
            emergency: stores.emergency,
            flow: stores.flow,
            apart: crate::conditions::Apart::default(),
        }
    }

    /// Spans for every call from now on, made by `tracer`.
    pub fn with_tracer(mut self, tracer: spans::Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// Has `observer` told of every call finished from now on; `false` if one already is.
    pub(crate) fn observe_calls(&self, observer: Arc<dyn CallObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// The catalog in force now, and its rate limits. The one part the boundary hands out: it is
    /// the boundary's to swap ([`Boundary::replace_catalog`]), so only it knows which is served.
    /// The catalog updater builds the next catalog on this one (live concurrency caps carry
    /// over), the shadow worker names the served revision beside the candidate's, the server
    /// sweeps these rate limits, and `toolgate test --coverage` reads the tools it covered.
    /// Changes each time the catalog is replaced (what a caller sees may have changed).
    pub fn watch_catalog(&self) -> tokio::sync::watch::Receiver<u64> {
        self.catalog_changes.subscribe()
    }

    pub fn catalog(&self) -> Arc<CatalogState> {
        self.state.load_full()
    }

    /// Resolves when a running call must stop: the sidecar's hard stop at the end of the
    /// shutdown grace period, or an emergency deny with `cancel_running` that matches it. One
    /// wait serves both (the epoch is a child of the calls' stop signal).
    ///
    /// Not an `async fn`, for the reason `execute` gives: every call in flight holds this wait.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    fn interrupted<'a>(
        &'a self,
        mut epoch: Arc<tokio_util::sync::CancellationToken>,
        tool: &'a str,
        caller: &'a Caller,
    ) -> impl Future<Output = Refusal> + Send + 'a {
        async move {
            loop {
                epoch.cancelled().await;
                if self.calls.is_cancelled() {
                    return Refusal::new(
                        Stage::Execute,
                        Reason::Cancelled,
                        "the sidecar is shutting down",
                    );
                }
                // The next epoch first, so a deny seen while this one looks is not missed.
                let next = self.emergency.epoch();
                if let Some(active) = self.emergency.stopping(tool, caller) {
                    return emergency::refused(tool, &active.deny, true);
                }
                epoch = next;
            }
        }
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
        self.calls.cancel();
    }

    /// Calls being decided or run now.
    pub fn in_flight(&self) -> usize {
        self.calls.running()
    }

    /// Waits until no call is being decided or run; calls started from now on are still
    /// counted (and waited for).
    pub async fn calls_finished(&self) {
        self.calls.finished().await;
    }

    /// Replaces the catalog. Calls already running keep the definition they started with; rate
    /// limit state carries over for unchanged quotas; open approvals of changed tools are voided.
    pub async fn replace_catalog(&self, catalog: Catalog) -> usize {
        let previous = self.state.load_full();
        let rate_limits = Quotas::build(
            &catalog,
            self.clock.clone(),
            &self.backend,
            &self.quota_metrics,
            Some(&previous.rate_limits),
        );
        let invalidated = self.approvals.invalidate_changed(&catalog).await;
        self.pins
            .swapped(&catalog, &self.audit, &self.metrics, &self.clock)
            .await;
        self.metrics.serving_revision(catalog.revision());
        self.state.store(Arc::new(CatalogState {
            catalog,
            rate_limits,
        }));
        self.catalog_changes
            .send_modify(|generation| *generation += 1);
        invalidated
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
            // Counted by the boundary's own tracker (also what /metrics reads as calls_in_flight).
            let _in_flight = self.calls.count();
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
                spans::record_call(
                    &mut span,
                    &turn.caller,
                    turn.door,
                    guard.names(),
                    None,
                    &outcome,
                );
                self.metrics.observe(&outcome, None);
                return outcome;
            }
            // Taken before the call is decided: a deny stopping running calls, seen after its
            // access check, still reaches it.
            let interrupt = self.emergency.epoch();
            let chain =
                AssertUnwindSafe(self.chain(turn, &call, &guard.call_id, &mut guard.trail, &span))
                    .catch_unwind();
            let result = tokio::select! {
                result = chain => result.unwrap_or_else(|panic| {
                    tracing::error!(tool = %call.name, call_id = %guard.call_id, panic = panic_message(&panic), "a call panicked; this is a bug in toolgate");
                    Err(Refusal::new(Stage::Execute, Reason::Internal, "internal error in toolgate; the call's outcome is unknown"))
                }),
                // Shutdown's hard stop, or an operator's emergency deny with cancel_running:
                // the chain (and the backend with it) is dropped, as when the client cancels.
                refusal = self.interrupted(interrupt, &call.name, &turn.caller) => Err(refusal),
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
                    // Of a tool the caller may not see, not even its version is told.
                    let version = match refusal.reason {
                        Reason::ToolNotFound => String::new(),
                        _ => trail.tool_version().to_owned(),
                    };
                    CallOutcome::refused(call_id, call.name, version, refusal)
                }
            };
            if !budget.borrow().take(&outcome) {
                outcome = result::over_budget(outcome);
            }
            outcome.duration = started.elapsed();
            outcome.idempotent_replay = trail.idempotent_replay;
            spans::record_call(
                &mut span,
                &turn.caller,
                turn.door,
                guard.names(),
                trail.tool.as_deref(),
                &outcome,
            );
            let known = !outcome.tool_version.is_empty()
                || self.state.load().catalog.contains(&outcome.tool);
            self.metrics.observe(&outcome, known.then_some(&guard.tool));
            self.metrics.output_guard(&guard.tool, &trail.output_guard);
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
    ///
    /// Not an `async fn`, for the reason `execute` gives: a copy of each argument would sit
    /// beside the stages' state, and the call's future is sized by it.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    fn chain<'a>(
        &'a self,
        turn: &'a Turn,
        call: &'a CallRequest,
        call_id: &'a Arc<str>,
        trail: &'a mut CallTrail,
        span: &'a spans::ToolgateSpan,
    ) -> impl Future<Output = Result<Success, Refusal>> + Send + 'a {
        async move {
            // The catalog is pinned for the rest of this call, even if a reload happens meanwhile.
            let state = self.state.load_full();
            // 1-9 run in a future of their own, so what they hold is gone while the backend runs.
            let admitted = self.admit(&state, turn, call, call_id, trail).await?;
            // 10-12. A tool with flow labels adds them to its scope just before its backend is
            // called, or it does not run.
            let labelling = trail
                .tool
                .as_ref()
                .and_then(|tool| flow::labelling(state.catalog.flow.as_ref(), tool));
            self.dispatch(turn, call, call_id, admitted, labelling, trail, span)
                .await
        }
    }

    /// Adds the call's flow labels to its scope, when its tool carries any; refuses the call
    /// when they cannot be (nothing has run yet).
    async fn label(
        &self,
        labelling: Option<&crate::catalog::FlowPolicy>,
        turn: &Turn,
        call_id: &str,
        tool: &crate::catalog::ToolVersion,
        trail: &mut CallTrail,
    ) -> Result<(), Refusal> {
        if let Some(policy) = labelling {
            // Boxed: only labelled tools pay for writing the scope.
            trail.flow_labels = Box::pin(flow::record(
                &self.flow,
                policy,
                tool,
                &turn.caller,
                &turn.run_id,
                call_id,
            ))
            .await?;
        }
        Ok(())
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
        let asker = policy::Asker {
            caller,
            run_id: &turn.run_id,
            now: self.clock.system_time(),
            trace: false,
            apart: &self.apart,
        };
        // In a block of its own: what the stages saw is gone before anything is awaited.
        let (decided, look) = {
            let mut seen = policy::Seen::default();
            let shown = turn
                .catalog_revision
                .as_deref()
                .map(|shown| (&self.revisions, shown));
            let decided = policy::through_bind(
                &self.limits,
                &self.arguments_budget,
                catalog,
                &self.emergency,
                shown,
                &asker,
                call,
                &mut seen,
            );
            trail.tool = seen.tool.cloned();
            trail.bound_override_attempts = seen.override_attempts;
            let look = decided.as_ref().is_ok_and(|d| takes_long(state, d));
            (decided, look)
        };
        // 4b, after a look at the quotas when it or a later stage evaluates a condition that
        // can take long. Boxed, the decision moved in: only such calls pay for the look.
        let decided = match look {
            true => Box::pin(rate_limit::room_for(state, caller, decided)).await,
            false => decided,
        };
        let decided = {
            let mut seen = policy::Seen::default();
            let decided = decided.and_then(|decided| {
                policy::access_on_call(catalog, &asker, &decided, &mut seen)?;
                Ok(decided)
            });
            // Refused after bind by a rule on the arguments: the record names what it decided
            // on, as explain does.
            if let Some(refused) = &seen.refused_arguments {
                trail.arguments_sha256 = Some(crate::canonical::sha256_hex_shared(refused));
            }
            decided
        };
        let decided = decided.map_err(|refusal| {
            visibility::as_caller_sees(catalog, &self.emergency, caller, &call.name, refusal)
        });
        let policy::Decided {
            tool,
            arguments,
            arguments_sha256,
            held,
            ..
        } = decided?;
        trail.arguments_sha256 = Some(arguments_sha256.clone());
        // A recorded copy of the arguments lives as long as the call: it is charged too.
        let record_held = match tool.record_arguments {
            true => {
                let held = self.arguments_budget.take(held.bytes())?;
                trail.arguments = Some(Box::new(redaction::redact(&arguments, &tool.redact)));
                Some(held)
            }
            false => None,
        };
        // 7b. Flow rules: what this run (or caller) has seen may forbid this tool now, or
        // make it need an approval.
        // Boxed: only the tools a rule governs pay for reading the scope.
        let flow_approval = match flow::governing(catalog.flow.as_ref(), tool) {
            Some(policy) => {
                Box::pin(flow::check(&self.flow, policy, tool, caller, &turn.run_id)).await?
            }
            None => None,
        };
        // 8. Rate limits: both quotas, or neither; the tool's by the call's cost.
        rate_limit::check(state, &asker, tool, &arguments).await?;
        // 9. Approval for risky tools, bound to these exact arguments; used up only when the
        // call reaches its backend.
        // Boxed: only the tools that need approval pay for the stage's state.
        let needed = match (approval::needed(tool, &asker, &arguments).0, flow_approval) {
            (Ok(why), _) | (Err(_), Some(why)) => Ok(why),
            (Err(no), None) => Err(no),
        };
        let approval = match needed {
            Ok(why) => Some(
                Box::pin(self.approval(turn, call, tool, &arguments, &arguments_sha256, &why))
                    .await?,
            ),
            Err(_) => None,
        };
        trail.approval_id = approval.as_ref().map(|a| a.id.clone());
        if let Some(checked) = &approval {
            approval::check_reuse(&checked.id, checked.already_used, call)?;
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
    #[expect(
        clippy::too_many_arguments,
        reason = "the chain's parts, each its own concern"
    )]
    fn dispatch<'a>(
        &'a self,
        turn: &'a Turn,
        call: &'a CallRequest,
        call_id: &'a str,
        mut admitted: Admitted,
        labelling: Option<&'a crate::catalog::FlowPolicy>,
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
                    self.label(labelling, turn, call_id, admitted.permit.tool(), trail)
                        .await?;
                    let result = self
                        .call_backend(turn, span, &mut admitted.permit, approval_id, &started)
                        .await;
                    // 12b. The output guard, before anything keeps or returns the result.
                    let (result, findings) = output_guard::screen(admitted.permit.tool(), result);
                    trail.output_guard = findings;
                    result
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
                                self.label(labelling, turn, call_id, tool, trail).await?;
                                trail.idempotent_replay = true;
                                trail.replayed_version = Some(stored.tool_version);
                                // Screened when stored; again, by the guard in force now.
                                let (result, findings) = output_guard::screen(tool, stored.result);
                                trail.output_guard = findings;
                                result
                            }
                            Claimed::Owner(slot) => {
                                let labelled = self
                                    .label(labelling, turn, call_id, admitted.permit.tool(), trail)
                                    .await;
                                let result = match labelled {
                                    Ok(()) => {
                                        self.call_backend(
                                            turn,
                                            span,
                                            &mut admitted.permit,
                                            approval_id,
                                            &started,
                                        )
                                        .await
                                    }
                                    // Retryable: the key is given back.
                                    Err(refusal) => Err(refusal),
                                };
                                let (result, findings) =
                                    output_guard::screen(admitted.permit.tool(), result);
                                trail.output_guard = findings;
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
}

/// Whether deciding this call from here on evaluates a condition that can take long (one that
/// iterates over the arguments): access on the call (4b), the quota cost or the approval
/// condition. Then a quota that has no room for the call refuses it first
/// ([`rate_limit::room`]), as stage 8 would anyway, and the evaluation is spared; the chain's
/// order otherwise stands (a call refused by 4b consumes no quota).
fn takes_long(state: &CatalogState, decided: &policy::Decided<'_>) -> bool {
    let tool = decided.tool;
    let long = |condition: &Option<Arc<crate::conditions::Condition>>| {
        condition.as_deref().is_some_and(|c| c.may_take_long())
    };
    (decided.provisional && state.catalog.call_conditions_take_long())
        || long(&tool.quota_cost)
        || (tool.requires_approval && long(&tool.approval_when))
}

/// Bytes held by the stores kept between calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreBytes {
    pub idempotency: usize,
    pub approvals: usize,
    pub revision_log: usize,
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
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
