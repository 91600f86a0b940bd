//! The chain: the one ordered sequence of stages every tool call passes, top to bottom, each
//! named by a [`Step`]. [`Boundary::execute`] frames a call (its audit slot, span,
//! interruption and outcome); `chain` runs the steps in order: `admit` (1-9: stages 1-7
//! through `policy`, then 7a-9, decided before the backend is called) and `dispatch` (10-12b,
//! the backend and its result). Each stage is a function in its own file (the table in
//! `mod.rs`); the first refusal ends the chain.

use std::{
    borrow::Borrow,
    panic::AssertUnwindSafe,
    sync::{Arc, atomic::AtomicBool},
};

use futures::FutureExt;
use tokio::time::Instant;

use super::*;

enum_with_all! {
/// Every step of the chain, in the order a call passes them, numbered as the table of
/// docs/boundary.md numbers its rows (a test holds the two, and [`Stage`]'s order, to each
/// other). A step's refusal names the [`Stage`] it reports as, its `refused_by`
/// ([`Step::refused_as`]): conditions on the call and flow rules refuse as `access`, the output
/// guard as `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// A blank call id is numbered; a long one cut.
    CallId,
    Structure,
    Resolve,
    /// The allow and deny lists on the caller and tool, then the emergency denies.
    Access,
    Scopes,
    Schema,
    Bind,
    /// The allow and deny entries whose conditions read the call, on the bound arguments.
    AccessOnCall,
    Flow,
    RateLimit,
    Approval,
    Idempotency,
    Execute,
    Result,
    OutputGuard,
}
}

/// The steps a call has reached, in a build with debug assertions (every test's): reaching one
/// out of [`Step`]'s order panics, so the chain's code, `Step` and the docs' table (held to
/// `Step` by a docs test) cannot drift apart. Nothing in a release build.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Steps {
    #[cfg(debug_assertions)]
    last: Option<Step>,
}

impl Steps {
    /// The call reaches `step`.
    pub(crate) fn reached(&mut self, step: Step) {
        #[cfg(debug_assertions)]
        {
            assert!(
                self.last < Some(step),
                "the chain reached {step:?} after {:?}: its order is Step's",
                self.last
            );
            self.last = Some(step);
        }
        #[cfg(not(debug_assertions))]
        let _ = step;
    }
}

impl Step {
    /// The step's number in docs/boundary.md's table.
    pub fn number(self) -> &'static str {
        match self {
            Step::CallId => "1",
            Step::Structure => "2",
            Step::Resolve => "3",
            Step::Access => "4",
            Step::Scopes => "5",
            Step::Schema => "6",
            Step::Bind => "7",
            Step::AccessOnCall => "7a",
            Step::Flow => "7b",
            Step::RateLimit => "8",
            Step::Approval => "9",
            Step::Idempotency => "10",
            Step::Execute => "11",
            Step::Result => "12",
            Step::OutputGuard => "12b",
        }
    }

    /// The stage its refusals name (`refused_by`); `None` for a step that refuses nothing.
    pub fn refused_as(self) -> Option<Stage> {
        Some(match self {
            Step::CallId => return None,
            Step::Structure => Stage::Structure,
            Step::Resolve => Stage::Resolve,
            Step::Access | Step::AccessOnCall | Step::Flow => Stage::Access,
            Step::Scopes => Stage::Scopes,
            Step::Schema => Stage::Schema,
            Step::Bind => Stage::Bind,
            Step::RateLimit => Stage::RateLimit,
            Step::Approval => Stage::Approval,
            Step::Idempotency => Stage::Idempotency,
            Step::Execute => Stage::Execute,
            Step::Result | Step::OutputGuard => Stage::Result,
        })
    }
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
    /// What it took of its budgets: given back if its backend is never reached.
    /// (Boxed, none when it took nothing: every call's future holds its place.)
    budget: Option<Box<crate::budgets::Taken>>,
    /// The arguments' share of the parsed-arguments budget (and their recorded copy's), held
    /// until the backend has answered.
    _held: (structure::ArgumentsHeld, Option<structure::ArgumentsHeld>),
}

impl Boundary {
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
                tool_spans::record_call(
                    &mut span,
                    &turn.caller,
                    turn.door,
                    guard.names(),
                    None,
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
            tool_spans::record_call(
                &mut span,
                &turn.caller,
                turn.door,
                guard.names(),
                trail.tool.as_deref(),
                trail.credential.as_deref(),
                &outcome,
            );
            let known = !outcome.tool_version.is_empty()
                || self.state.load().catalog.contains(&outcome.tool);
            self.metrics.observe(&outcome, known.then_some(&guard.tool));
            self.metrics.output_guard(&guard.tool, &trail.output_guard);
            if let Some(arguments) = &trail.arguments {
                tool_spans::record_content(&mut span, arguments, &outcome);
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
            // 10-12, on the backends of the same catalog.
            self.dispatch(turn, call, call_id, admitted, &state, trail, span)
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
            trail.steps = seen.steps;
            let look = decided.as_ref().is_ok_and(|d| takes_long(state, d));
            (decided, look)
        };
        // 7a, after a look at the quotas when it or a later stage evaluates a condition that
        // can take long. Boxed, the decision moved in: only such calls pay for the look.
        let decided = match look {
            true => Box::pin(rate_limit::room_for(state, caller, decided)).await,
            false => decided,
        };
        let decided = {
            let mut seen = policy::Seen::default();
            let decided = decided.and_then(|decided| {
                trail.steps.reached(Step::AccessOnCall);
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
        trail.steps.reached(Step::Flow);
        let flow_approval = match flow::governing(catalog.flow.as_ref(), tool) {
            Some(policy) => {
                Box::pin(flow::check(&self.flow, policy, tool, caller, &turn.run_id)).await?
            }
            None => None,
        };
        // 8. Rate limits and budgets: both quotas and every budget, or none; the tool's quota
        // (and the budgets' cost) by the call's cost.
        trail.steps.reached(Step::RateLimit);
        let budget = rate_limit::check(state, &self.budgets, &asker, tool, &arguments).await?;
        // 9. Approval for risky tools, bound to these exact arguments; used up only when the
        // call reaches its backend.
        // Boxed: only the tools that need approval pay for the stage's state.
        trail.steps.reached(Step::Approval);
        let needed = match (approval::needed(tool, &asker, &arguments).0, flow_approval) {
            (Ok(why), _) | (Err(_), Some(why)) => Ok(why),
            (Err(no), None) => Err(no),
        };
        let approval = match needed {
            Ok(why) => {
                let checked =
                    Box::pin(self.approval(turn, call, tool, &arguments, &arguments_sha256, &why))
                        .await
                        .and_then(|checked| {
                            trail.approval_id = Some(checked.id.clone());
                            approval::check_reuse(&checked.id, checked.already_used, call)?;
                            Ok(checked)
                        });
                match checked {
                    Ok(checked) => Some(checked),
                    // Waiting for an approval (or refused one) spends no budget.
                    Err(refusal) => {
                        return match budget {
                            Some(taken) => {
                                Box::pin(async {
                                    self.budgets.give_back(*taken).await;
                                    Err(refusal)
                                })
                                .await
                            }
                            None => Err(refusal),
                        };
                    }
                }
            }
            Err(_) => None,
        };
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
            budget,
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
        state: &'a CatalogState,
        trail: &'a mut CallTrail,
        span: &'a spans::ToolgateSpan,
    ) -> impl Future<Output = Result<Success, Refusal>> + Send + 'a {
        async move {
            // A tool with flow labels adds them to its scope just before its backend is called,
            // or it does not run.
            let labelling = trail
                .tool
                .as_ref()
                .and_then(|tool| flow::labelling(state.catalog.flow.as_ref(), tool));

            // Set when the call is handed to its backend: from then on, its effects are unknown
            // until it answers.
            let started = AtomicBool::new(false);
            let approval_id = admitted.approval_id.as_deref();
            // 10. Idempotency, wrapping 11-12: execute under the deadline and shape the result.
            // The keyed path is boxed: only calls that use it pay for its state.
            trail.steps.reached(Step::Idempotency);
            let output = match call.idempotency_key.as_deref() {
                None => {
                    self.label(labelling, turn, call_id, admitted.permit.tool(), trail)
                        .await?;
                    trail.steps.reached(Step::Execute);
                    let result = self
                        .call_backend(
                            turn,
                            span,
                            state,
                            &mut admitted.permit,
                            approval_id,
                            &started,
                        )
                        .await;
                    trail.credential = admitted.permit.credential().cloned();
                    trail.steps.reached(Step::Result);
                    // 12b. The output guard, before anything keeps or returns the result.
                    trail.steps.reached(Step::OutputGuard);
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
                                trail.steps.reached(Step::OutputGuard);
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
                                        trail.steps.reached(Step::Execute);
                                        let result = self
                                            .call_backend(
                                                turn,
                                                span,
                                                state,
                                                &mut admitted.permit,
                                                approval_id,
                                                &started,
                                            )
                                            .await;
                                        trail.credential = admitted.permit.credential().cloned();
                                        trail.steps.reached(Step::Result);
                                        result
                                    }
                                    // Retryable: the key is given back.
                                    Err(refusal) => Err(refusal),
                                };
                                trail.steps.reached(Step::OutputGuard);
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
            };
            // A call whose backend was never reached (refused on the way, replayed, or not
            // reached at all) gives back what it took of its budgets.
            let output = match admitted.budget.take() {
                // Boxed with the output it carries: only calls that took from a budget, and did
                // not reach their backend, pay for holding both across the give-back.
                Some(taken) if !started.load(std::sync::atomic::Ordering::Acquire) => {
                    Box::pin(async {
                        self.budgets.give_back(*taken).await;
                        output
                    })
                    .await
                }
                _ => output,
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
/// iterates over the arguments): access on the call (7a), the quota cost or the approval
/// condition. Then a quota that has no room for the call refuses it first
/// ([`rate_limit::room`]), as stage 8 would anyway, and the evaluation is spared; the chain's
/// order otherwise stands (a call refused by 7a consumes no quota).
fn takes_long(state: &CatalogState, decided: &policy::Decided<'_>) -> bool {
    let tool = decided.tool;
    let long = |condition: &Option<Arc<crate::conditions::Condition>>| {
        condition.as_deref().is_some_and(|c| c.may_take_long())
    };
    (decided.provisional && state.catalog.call_conditions_take_long())
        || long(&tool.quota_cost)
        || (tool.requires_approval && long(&tool.approval_when))
}
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}
