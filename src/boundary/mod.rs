//! The execution boundary: every tool call passes one ordered chain of stages, written top to
//! bottom in `chain.rs` ([`Boundary::execute`]). Each stage lives in its own file and returns a typed
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
//! | 4 | access (then emergency denies) | `access.rs`, `emergency.rs` | `crate::emergency` (memory, Redis) |
//! | 5 | scopes | `scopes.rs` | — |
//! | 6 | schema | `schema.rs` | — |
//! | 7 | bind | `bind.rs` | — |
//! | 7a | access on the call | `access.rs` (`policy::access_on_call`) | — |
//! | 7b | flow rules | `flow.rs` | `crate::flow` (memory, Redis) |
//! | 8 | rate limit and budgets | `rate_limit.rs` | `crate::limits`, `crate::budgets` (memory, Redis) |
//! | 9 | approval | `approval.rs` | `crate::approvals` (memory, Redis) |
//! | 10 | idempotency | `idempotency/` | its own (memory, Redis) |
//! | 11 | execute | `execute.rs` | — |
//! | 12 | result | `result.rs` | — |
//! | 12b | output guard | `output_guard.rs` | — |
//!
//! Beside them: the call's record (`trail.rs`), what ListTools shows (`visibility.rs`), redaction
//! (`redaction.rs`), the approvals RPCs (`approvals_admin.rs`), the sealed `Permit`, the observer
//! of finished calls, explanation, pinned MCP tools' changes at catalog swaps (`pins.rs`), what
//! a tool call's span says of it (`tool_spans.rs`), and the boundary's metrics (`metrics.rs`).

// The stages (see the table).
pub mod access;
mod approval;
pub mod bind;
mod chain;
mod execute;
mod flow;
mod handoff;
pub mod idempotency;
mod rate_limit;
pub mod resolve;
mod result;
pub mod schema;
pub mod scopes;
pub mod structure;
mod tool_spans;

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

use std::{collections::BTreeMap, sync::Arc};

use arc_swap::ArcSwap;
use futures::{StreamExt, stream};
use opentelemetry::trace::TraceContextExt;
use tokio::time::Instant;

pub use approval::condition_location as approval_condition_location;
pub use chain::Step;
pub(crate) use observer::{CallObserver, FinishedCall};
pub use permit::Permit;
pub use rate_limit::{cost_location as quota_cost_location, quota_of, quota_plan};
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
    executor::{Executors, Upstream},
    identity::Caller,
    identity::Door,
    limits::{InFlight, Quotas, metrics::QuotaMetrics},
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

/// The catalog and the state that must change with it, swapped as one on reload: a call runs on
/// the backends of the catalog it was decided under.
pub struct CatalogState {
    pub catalog: Catalog,
    pub rate_limits: Quotas,
    /// The slots of its versions capped in calls in flight.
    pub in_flight: InFlight,
    /// The live clients the catalog's backend specs name.
    pub executors: Executors,
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
            approvals: Approvals::on(&backend, clock.clone(), approvals),
            idempotency: Idempotency::on(&backend, clock.clone(), idempotency),
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
        // A sub-agent's spans continue its parent's trace when its runtime sent none.
        let trace_parent = match caller.delegation.as_deref() {
            Some(delegation) if !trace_parent.span().span_context().is_valid() => delegation
                .traceparent
                .as_deref()
                .map_or(trace_parent, |parent| {
                    spans::extract_from_meta(parent, None)
                }),
            _ => trace_parent,
        };
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
    /// What each run and caller's day has spent of its budgets.
    budgets: crate::budgets::Budgets,
    /// Where evaluations of conditions that can take long run.
    apart: crate::conditions::Apart,
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
        let budgets = crate::budgets::Budgets::on(&stores.backend, clock.clone(), registry);
        let rate_limits = Quotas::build(
            &quota_plan(&catalog),
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
                in_flight: InFlight::build(execute::in_flight_caps(&catalog), None),
                catalog,
                rate_limits,
                executors,
            }),
            idempotency: stores.idempotency,
            revisions: RevisionLog::new(limits.revision_log_max_bytes),
            limits,
            backend: stores.backend,
            approvals: stores.approvals,
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
            budgets,
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

    /// Replaces the catalog, and with `upstreams` (a reloaded file's) the HTTP clients its tools
    /// run on; without, the current ones serve on. Calls already running keep the definition and
    /// the clients they started with; rate limit state carries over for unchanged quotas, and
    /// slots in flight for unchanged upstreams; open approvals of changed tools are voided.
    pub async fn replace_catalog(
        &self,
        catalog: Catalog,
        upstreams: Option<BTreeMap<String, Upstream>>,
    ) -> usize {
        let previous = self.state.load_full();
        let executors = match upstreams {
            Some(upstreams) => previous.executors.with_upstreams(upstreams),
            None => previous.executors.clone(),
        };
        // The catalog and its upstreams are joined by name only: one built from another file
        // than the upstreams kept would fail its HTTP calls at run time.
        debug_assert!(
            catalog.versions().all(|tool| match &tool.backend {
                crate::catalog::BackendSpec::Http(target) => executors.http.has(&target.upstream),
                crate::catalog::BackendSpec::A2a(target) => executors.http.has(&target.upstream),
                _ => true,
            }),
            "a catalog names an upstream its executors do not have"
        );
        let rate_limits = Quotas::build(
            &quota_plan(&catalog),
            self.clock.clone(),
            &self.backend,
            &self.quota_metrics,
            Some(&previous.rate_limits),
        );
        let invalidated = self
            .approvals
            .invalidate_changed(&approval::served(&catalog))
            .await;
        self.pins
            .swapped(&catalog, &self.audit, &self.metrics, &self.clock)
            .await;
        self.metrics.serving_revision(catalog.revision());
        let in_flight =
            InFlight::build(execute::in_flight_caps(&catalog), Some(&previous.in_flight));
        self.state.store(Arc::new(CatalogState {
            catalog,
            rate_limits,
            in_flight,
            executors,
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
}

/// Bytes held by the stores kept between calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreBytes {
    pub idempotency: usize,
    pub approvals: usize,
    pub revision_log: usize,
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
