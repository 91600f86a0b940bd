//! Stage 11: the call runs on its backend, under min(tool timeout, client deadline) and the
//! tool's concurrency cap, inside its CLIENT span; an approval is used up as the call is handed
//! over, and given back if the backend was never reached. How a backend's failure or a timeout
//! becomes a refusal is decided here too: a write that may have reached its backend is an
//! unknown outcome, never retryable.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::Instant;

use super::{
    Boundary, CatalogState, Permit, Turn, output_guard::MAX_SCREENED_DETAIL_BYTES,
    redaction::redact_text, truncate_utf8,
};
use crate::{
    catalog::{Catalog, ToolVersion},
    error::{Reason, Refusal, Stage},
    executor::ExecError,
    limits::VersionCap,
    settings::RiskLevel,
    telemetry::spans,
};

/// Stage 11's caps on calls in flight, as the pools key them.
pub(super) fn in_flight_caps(catalog: &Catalog) -> impl Iterator<Item = VersionCap<'_>> {
    catalog.versions().filter_map(|tool| {
        tool.max_concurrency.map(|cap| VersionCap {
            name: &tool.name,
            version: &tool.version,
            cap,
        })
    })
}

impl Boundary {
    /// Calls the backend inside its CLIENT span, whose context is what the backend receives as
    /// `traceparent`.
    pub(super) fn call_backend<'a>(
        &'a self,
        turn: &Turn,
        call_span: &spans::ToolgateSpan,
        state: &'a CatalogState,
        permit: &'a mut Permit,
        approval_id: Option<&'a str>,
        started: &'a AtomicBool,
    ) -> impl Future<Output = Result<String, Refusal>> + Send + 'a {
        let tool = permit.tool();
        let leaves_process = tool.backend.leaves_process();
        let span = spans::backend_call(
            &self.tracer,
            tool.backend.kind(),
            &tool.name,
            leaves_process,
            call_span,
            &turn.trace_parent,
        );
        let traceparent = spans::outbound_traceparent(&span, leaves_process, &turn.trace_parent);
        permit.set_traceparent(traceparent);
        self.run(state, permit, span, turn.deadline, approval_id, started)
    }

    /// Stage 11 (and 12's output limit): run under min(tool timeout, client deadline), then check
    /// the output.
    /// An approval is used up here, as the call is handed to the backend, and given back if the
    /// backend was never reached. The backend's span (`span`) ends, with its end time, when the
    /// backend answers or the call is dropped.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub(super) fn run<'a>(
        &'a self,
        state: &'a CatalogState,
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
            // A sub-agent's call ends with its delegation: never past the parent call's deadline.
            let deadline = match permit.caller().delegation.as_deref() {
                Some(delegation) => {
                    let left_ms = i64::try_from(delegation.expires)
                        .unwrap_or(i64::MAX / 1000)
                        .saturating_mul(1000)
                        .saturating_sub(self.clock.unix_ms());
                    let left =
                        std::time::Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
                    deadline.min(now + left)
                }
                None => deadline,
            };
            // Beyond a tool's concurrency cap, refuse at once rather than queue without bound.
            let _slot = match tool.max_concurrency {
                Some(_) => state
                    .in_flight
                    .take(&tool.name, &tool.version)
                    .map_err(|_| {
                        Refusal::new(
                            Stage::Execute,
                            Reason::Overloaded,
                            format!(
                                "{} is at its limit of calls in flight; retry shortly",
                                tool.name
                            ),
                        )
                    })?,
                None => None,
            };
            let executor = state.executors.for_backend(&tool.backend);
            // The backend's credential, before an approval is spent or anything is sent: a
            // deadline that passes here leaves nothing unknown, so the call may be retried.
            // (Boxed with its timer: the calls that fetch one already allocate, and the others
            // keep a small future.)
            if let Some(fetch) = executor.authenticate(permit) {
                match Box::pin(tokio::time::timeout_at(deadline, fetch)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => return Err(exec_refusal(err, permit)),
                    Err(_elapsed) => {
                        return Err(Refusal::new(
                            Stage::Execute,
                            Reason::CredentialsUnavailable,
                            format!(
                                "no credential for {} before {}; nothing was sent",
                                tool.name,
                                deadline_name(tool, deadline == tool_deadline)
                            ),
                        ));
                    }
                }
            }
            // A handoff's delegation, signed before anything is sent: never past this call's
            // deadline.
            if let Some(handoff) = &tool.handoff {
                let token = super::handoff::delegate(
                    state,
                    permit,
                    handoff,
                    deadline,
                    self.clock.unix_ms(),
                )?;
                permit.set_delegation(token);
            }
            let tenant = &permit.caller().tenant;
            if let Some(id) = approval_id {
                self.approvals
                    .consume(tenant, id)
                    .await
                    .map_err(|(reason, message)| {
                        Refusal::new(Stage::Approval, reason, message).with_approval_id(id)
                    })?;
            }
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
            // 12. The result: within the tool's output limit.
            super::result::check_output(tool, &output)?;
            Ok(output)
        }
    }
}

/// A backend failure as a refusal. The backend's own text goes to the caller; records carry it
/// only for tools that record their arguments, with the `redact` values taken out.
pub(super) fn exec_refusal(err: ExecError, permit: &Permit) -> Refusal {
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
        ExecError::CredentialsUnavailable(m) => (Reason::CredentialsUnavailable, m, None),
        ExecError::CredentialsRefused(m) => (Reason::CredentialsRefused, m, None),
        ExecError::BadArguments(m) => (Reason::SchemaViolation, m, None),
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
        // Cut to what is screened; the output guard's stage cuts what it passes on.
        let detail = truncate_utf8(detail.trim(), MAX_SCREENED_DETAIL_BYTES).to_owned();
        let tool = permit.tool();
        if tool.record_arguments {
            refusal.recorded_detail = Some(redact_text(&detail, permit.arguments(), &tool.redact));
        }
        refusal.detail = Some(detail);
    }
    refusal
}

/// Which deadline passed: the tool's timeout, or the client's.
fn deadline_name(tool: &ToolVersion, tool_timeout_hit: bool) -> String {
    if tool_timeout_hit {
        format!("its timeout of {} ms", tool.timeout.as_millis())
    } else {
        "the client's deadline".to_owned()
    }
}

fn timeout_refusal(tool: &ToolVersion, tool_timeout_hit: bool) -> Refusal {
    let limit = deadline_name(tool, tool_timeout_hit);
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
