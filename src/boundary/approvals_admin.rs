//! What the doors that decide approvals (the gRPC Approvals service, the console) ask of the
//! boundary: list, read and decide the approvals of an approver's tenant. Each needs the scope
//! `toolgate:approve`, checked here once for both stores and every door. Arguments are shown as
//! audit records show them: the values the tool's `redact` names replaced. A decision takes its
//! audit slot before it is applied, so an applied decision always has its event.

use super::Boundary;
use crate::{
    approvals::{self, Approval, ApprovalState, DecideError},
    audit::{AuditEvent, EventKind, EventTime, Party},
    identity::{Caller, Door},
};

impl Boundary {
    /// One page of the approvals of the approver's tenant.
    pub async fn list_approvals(
        &self,
        approver: &Caller,
        state: Option<ApprovalState>,
        order: approvals::Order,
        page_size: usize,
        after: Option<&approvals::Cursor>,
    ) -> Result<approvals::Page, DecideError> {
        authorize(approver)?;
        let mut page = self
            .approvals
            .list(approver, state, order, page_size, after)
            .await?;
        page.approvals = page.approvals.into_iter().map(|a| self.shown(a)).collect();
        Ok(page)
    }

    /// One approval of the approver's tenant, with its full arguments.
    pub async fn get_approval(&self, approver: &Caller, id: &str) -> Result<Approval, DecideError> {
        authorize(approver)?;
        Ok(self.shown(self.approvals.get(approver, id).await?))
    }

    /// Approves or rejects, and records the decision in the audit trail. The event's slot is
    /// taken before the decision is applied, so an applied decision always has its event.
    pub async fn decide_approval(
        &self,
        approver: &Caller,
        id: &str,
        approve: Option<bool>,
        reason: &str,
        door: Door,
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
            door: Some(door.as_str()),
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
        Ok(self.shown(approval))
    }

    /// The approval as an approver sees it: its arguments with the values its tool's `redact`
    /// names replaced, as in audit records; all of them when its tool version is no longer
    /// served (what it redacted is unknown).
    fn shown(&self, mut approval: Approval) -> Approval {
        let state = self.state.load();
        let redact = state
            .catalog
            .version(&approval.binding.tool, &approval.binding.tool_version)
            .map(|tool| tool.redact.as_slice());
        match redact {
            Some([]) => {}
            Some(pointers) => {
                approval.arguments_json = match serde_json::from_str(&approval.arguments_json) {
                    Ok(arguments) => {
                        crate::canonical::to_string(&super::redaction::redact(&arguments, pointers))
                    }
                    Err(_) => HIDDEN.to_owned(),
                }
            }
            None => approval.arguments_json = HIDDEN.to_owned(),
        }
        approval
    }

    /// Approvals waiting for a decision (in this sidecar's memory).
    pub fn pending_approvals(&self) -> usize {
        self.approvals.pending()
    }
}

/// Arguments that cannot be shown redacted: one JSON string in their place.
const HIDDEN: &str = "\"[redacted]\"";

/// Listing, reading and deciding approvals needs the scope `toolgate:approve`, held by the
/// caller itself: a sub-agent acting under a delegation acts only through tool calls.
fn authorize(approver: &Caller) -> Result<(), DecideError> {
    let delegated = approver.delegation.is_some();
    match approver.has_scope(approvals::APPROVE_SCOPE) && !delegated {
        true => Ok(()),
        false => Err(DecideError::MissingScope),
    }
}
