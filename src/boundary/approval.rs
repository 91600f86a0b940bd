//! Stage 9: approval for tools whose risk level needs it, bound to the exact arguments. A first
//! call creates a pending approval and is refused `APPROVAL_REQUIRED`; a repeat naming it is
//! checked here (approved, unexpired, bound to this caller, run, tool version, definition and
//! arguments) and used up only when it reaches its backend (stage 11).

use super::{Boundary, CallRequest, Turn, policy};
use crate::{
    approvals, canonical,
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage},
};

impl Boundary {
    /// Stage 9, for a tool that requires approval: creates an approval for a first call, or
    /// checks the one the call redeems.
    pub(super) async fn approval(
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
}

/// An approval that was used already may be named again only with the idempotency key of its
/// first call (which then replays); otherwise the repeat is refused (by execution and by
/// explain alike).
pub(super) fn check_reuse(id: &str, already_used: bool, call: &CallRequest) -> Result<(), Refusal> {
    if already_used && call.idempotency_key.is_none() {
        let (reason, message) = approvals::state_error(id, approvals::ApprovalState::Used, "");
        return Err(Refusal::new(Stage::Approval, reason, message).with_approval_id(id));
    }
    Ok(())
}
