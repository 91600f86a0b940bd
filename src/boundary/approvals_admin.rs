//! What the Approvals service asks of the boundary: list, read and decide the approvals of an
//! approver's tenant. Each needs the scope `toolgate:approve`, checked here once for both
//! stores. A decision takes its audit slot before it is applied, so an applied decision always
//! has its event.

use super::Boundary;
use crate::{
    approvals::{self, Approval, ApprovalState, DecideError},
    audit::{AuditEvent, EventKind, EventTime, Party},
    identity::Caller,
};

impl Boundary {
    /// One page of the approvals of the approver's tenant.
    pub async fn list_approvals(
        &self,
        approver: &Caller,
        state: Option<ApprovalState>,
        page_size: usize,
        after: Option<&approvals::Cursor>,
    ) -> Result<approvals::Page, DecideError> {
        authorize(approver)?;
        self.approvals.list(approver, state, page_size, after).await
    }

    /// One approval of the approver's tenant, with its full arguments.
    pub async fn get_approval(&self, approver: &Caller, id: &str) -> Result<Approval, DecideError> {
        authorize(approver)?;
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
        authorize(approver)?;
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

    /// Approvals waiting for a decision (in this sidecar's memory).
    pub fn pending_approvals(&self) -> usize {
        self.approvals.pending()
    }
}

/// Listing, reading and deciding approvals needs the scope `toolgate:approve`.
fn authorize(approver: &Caller) -> Result<(), DecideError> {
    match approver.has_scope(approvals::APPROVE_SCOPE) {
        true => Ok(()),
        false => Err(DecideError::MissingScope),
    }
}
