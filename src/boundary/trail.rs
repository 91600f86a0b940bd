//! What is recorded of a call: the trail the stages leave on the way (for the audit event, the
//! span and an observer), and the guard that sends the call's audit event whatever ends it.

use std::{sync::Arc, time::Duration};

use opentelemetry::trace::{SpanId, TraceId};
use tokio::time::Instant;

use super::Turn;
use crate::credentials::CredentialUsed;
use crate::{
    audit::{AuditEvent, EventKind, EventTime, Party, Reservation},
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage, Status},
    outcome::CallOutcome,
    output_guard::Finding,
};

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
    /// What the output guard found in the output (detectors and counts, never values).
    pub output_guard: Vec<Finding>,
    /// The flow labels the call added to its scope.
    pub flow_labels: Vec<String>,
    /// The credential its backend was called with (shared with the credential cache).
    pub credential: Option<Arc<CredentialUsed>>,
    /// The chain's steps the call reached, in order (checked in builds with debug assertions).
    pub steps: super::chain::Steps,
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
pub(super) struct AuditGuard<'t> {
    pub(super) turn: &'t Turn,
    /// As reported (numbered when blank, cut when long).
    pub(super) call_id: Arc<str>,
    /// As the client named it, cut to the identifier limit.
    pub(super) tool: Arc<str>,
    pub(super) time: EventTime,
    /// Trace and span ids, as `spans::ids` gives them.
    pub(super) trace: Option<([u8; 16], [u8; 8])>,
    pub(super) started: Instant,
    pub(super) trail: CallTrail,
    pub(super) reservation: Option<Reservation>,
}

impl AuditGuard<'_> {
    /// The call's id and tool name as recorded, for its span.
    pub(super) fn names(&self) -> super::tool_spans::CallNames<'_> {
        super::tool_spans::CallNames {
            call_id: &self.call_id,
            tool: &self.tool,
        }
    }

    pub(super) fn finish(mut self, outcome: &CallOutcome) {
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
            door: Some(self.turn.door.as_str()),
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
            output_guard: trail.output_guard,
            flow_labels: trail.flow_labels,
            credential: trail.credential,
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
