//! Stage 9: approval for tools whose risk level needs it, bound to the exact arguments. A first
//! call creates a pending approval and is refused `APPROVAL_REQUIRED`; a repeat naming it is
//! checked here (approved, unexpired, bound to this caller, run, tool version, definition and
//! arguments) and used up only when it reaches its backend (stage 11).
//!
//! A tool's `approval.when` narrows which of its calls need one: only those for which it holds,
//! or for which it cannot be evaluated (closed). The risk level (or `requires_approval`) still
//! says whether any can.

use serde_json::Value;

use super::{
    Boundary, CallRequest, Turn,
    explain::{Explainer, StageResult, StageTrail},
    policy::{self, Decided},
};
use crate::{
    approvals, canonical,
    catalog::ToolVersion,
    conditions::{Evaluated, Evaluation},
    error::{Reason, Refusal, Stage},
};

/// What `catalog` serves, as approvals are bound to it: a reload voids the open approvals of
/// definitions it no longer serves.
pub(super) fn served(catalog: &crate::catalog::Catalog) -> approvals::Served {
    let mut served = approvals::Served::default();
    served.tenants = catalog.tenants.keys().cloned().collect();
    for tool in catalog.versions() {
        served.serve(&tool.name, &tool.version, &tool.definition_hash);
    }
    served
}

/// Where a tool's approval condition is named in explanations and catalog tests.
pub fn condition_location(tool: &ToolVersion) -> String {
    format!("{}@{}.approval.when", tool.name, tool.version)
}

/// Why a call needs no approval; said only by explanations, so words are made only for them.
#[derive(Debug)]
pub(super) enum NotNeeded<'a> {
    /// The tool's risk level needs none.
    ByRiskLevel(&'a ToolVersion),
    /// The approval condition, whose source this is, does not hold for the arguments.
    ConditionDoesNotHold(&'a str),
}

impl std::fmt::Display for NotNeeded<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotNeeded::ByRiskLevel(tool) => write!(
                f,
                "no approval needed (risk level {})",
                tool.risk_level.as_str()
            ),
            NotNeeded::ConditionDoesNotHold(source) => write!(
                f,
                "no approval needed: the approval condition {source:?} does not hold for these arguments"
            ),
        }
    }
}

/// Whether this call of `tool` needs approval: `Ok` with why it does (appended to the
/// refusal's message; empty when every call of the tool does), `Err` with why not; and the
/// condition evaluated, when the asker traces.
pub(super) fn needed<'t>(
    tool: &'t ToolVersion,
    asker: &policy::Asker<'_>,
    arguments: &Value,
) -> (Result<String, NotNeeded<'t>>, Vec<Evaluated>) {
    let mut trace = Vec::new();
    let needed = needed_traced(tool, asker, arguments, &mut trace);
    (needed, trace)
}

fn needed_traced<'t>(
    tool: &'t ToolVersion,
    asker: &policy::Asker<'_>,
    arguments: &Value,
    trace: &mut Vec<Evaluated>,
) -> Result<String, NotNeeded<'t>> {
    if !tool.requires_approval {
        return Err(NotNeeded::ByRiskLevel(tool));
    }
    let Some(when) = &tool.approval_when else {
        return Ok(String::new());
    };
    let (evaluation, evaluated) = asker.apart.run(when.may_take_long(), || {
        let input = asker.call_input(tool, arguments);
        let evaluation = input.evaluate_at(|| condition_location(tool), when);
        (evaluation, input.take_trace())
    });
    trace.extend(evaluated);
    match evaluation {
        Evaluation::Holds(true) => Ok(format!(
            " (its approval condition {:?} holds)",
            when.source()
        )),
        Evaluation::Holds(false) => Err(NotNeeded::ConditionDoesNotHold(when.source())),
        Evaluation::Failed(error) => Ok(format!(
            " (its approval condition {:?} could not be evaluated: {error}; so it needs one)",
            when.source()
        )),
        // Not reachable with the call given; decided closed all the same.
        Evaluation::Unknown => Ok(format!(
            " (its approval condition {:?} could not be decided)",
            when.source()
        )),
    }
}

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
        why: &str,
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
                    .create(
                        binding,
                        canonical::to_string(arguments),
                        tool.risk_level,
                        needed_because(tool, why),
                    )
                    .await
                    .map_err(refuse)?;
                Err(Refusal::new(
                    Stage::Approval,
                    Reason::ApprovalRequired,
                    format!(
                        "{} needs approval{why}; an approver must approve {} before the call is repeated with that approval_id",
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

/// Why the call needs an approval, as its record says it to the approver: `why` (as the
/// refusal says it, ` (…)`) without its parentheses, or the tool's risk level.
fn needed_because(tool: &ToolVersion, why: &str) -> String {
    match why.strip_prefix(" (").and_then(|w| w.strip_suffix(')')) {
        Some(why) => why.to_owned(),
        None => format!("its risk level is {}", tool.risk_level.as_str()),
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

impl Explainer<'_> {
    /// Stage 9, checked without creating anything: the trail, and the approval the call would
    /// redeem or the refusal.
    pub(super) async fn approval(
        &self,
        turn: &Turn,
        call: &CallRequest,
        decided: &Decided<'_>,
        flow_why: Option<String>,
    ) -> (StageTrail, Result<Option<String>, Refusal>) {
        let tool = decided.tool;
        let asker = policy::Asker {
            caller: &turn.caller,
            run_id: &turn.run_id,
            now: self.boundary.clock.system_time(),
            trace: false,
            apart: &self.boundary.apart,
        };
        // As the chain decides: the tool's own reason first, else a flow rule's.
        let why = match (needed(tool, &asker, &decided.arguments).0, flow_why) {
            (Ok(why), _) | (Err(_), Some(why)) => why,
            (Err(not_needed), None) => {
                return (
                    StageTrail::new(
                        Stage::Approval,
                        StageResult::NotApplicable,
                        not_needed.to_string(),
                    ),
                    Ok(None),
                );
            }
        };
        let refused = |refusal: Refusal| {
            (
                StageTrail::new(
                    Stage::Approval,
                    StageResult::Refused,
                    refusal.message.clone(),
                ),
                Err(refusal),
            )
        };
        let Some(id) = call
            .approval_id
            .as_deref()
            .filter(|id| !id.trim().is_empty())
        else {
            return refused(Refusal::new(
                Stage::Approval,
                Reason::ApprovalRequired,
                format!(
                    "{} needs approval{why}: execution would create an approval bound to this caller, run, tool version and these arguments, and return its approval_id (explain created none)",
                    tool.name
                ),
            ));
        };
        let binding =
            policy::approval_binding(&turn.caller, &turn.run_id, tool, &decided.arguments_sha256);
        let checked = match self.boundary.approvals.check(id, &binding).await {
            Ok(checked) => checked,
            Err((reason, message)) => {
                return refused(
                    Refusal::new(Stage::Approval, reason, message).with_approval_id(id),
                );
            }
        };
        let used_by_another = checked.already_used && !self.own.approval;
        if let Err(refusal) = check_reuse(id, used_by_another, call) {
            return refused(refusal);
        }
        let detail = if used_by_another {
            format!(
                "approval {id} was already used: only a replay of its call under the same idempotency key would pass"
            )
        } else {
            format!(
                "approval {id} would be accepted: approved, unexpired, and bound to this caller, run, tool version, definition and these arguments (nothing was used up)"
            )
        };
        (
            StageTrail::new(Stage::Approval, StageResult::Passed, detail),
            Ok(Some(id.to_owned())),
        )
    }
}
