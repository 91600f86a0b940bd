//! Stage 4, last: the operators' emergency denies (`crate::emergency`), once the catalog's
//! rules admit the tool. ListTools hides what a deny refuses; a call is told of the deny only
//! when its caller would see the tool without it (`visibility::as_caller_sees`), so a deny
//! tells nobody about tools hidden from them.

use crate::{
    catalog::ToolVersion,
    emergency::EmergencyDenies,
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

pub(crate) fn check(
    denies: &EmergencyDenies,
    tool: &ToolVersion,
    caller: &Caller,
) -> Result<(), Refusal> {
    match denies.matching(&tool.name, &caller.tenant, &caller.agent) {
        None => Ok(()),
        Some(active) => Err(refused(&tool.name, &active.deny, false)),
    }
}

/// The refusal of a call of `tool` that `deny` stops; `running` when it stopped the call
/// while it ran.
pub(crate) fn refused(
    tool: &str,
    deny: &crate::emergency::EmergencyDeny,
    running: bool,
) -> Refusal {
    let (stage, how) = match running {
        false => (Stage::Access, "is stopped"),
        true => (
            Stage::Execute,
            "was stopped while it ran (for a tool that writes, its outcome is unknown)",
        ),
    };
    Refusal::new(
        stage,
        Reason::EmergencyDenied,
        format!(
            "{tool} {how} by emergency deny {}: {}",
            deny.id, deny.reason
        ),
    )
}
