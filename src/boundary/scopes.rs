//! Stage 5: the caller holds every scope the tool requires.

use super::explain::{StageResult, StageTrail};
use crate::{
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

pub fn check(caller: &Caller, tool: &ToolVersion) -> Result<(), Refusal> {
    match missing(caller, tool) {
        None => Ok(()),
        Some(scope) => Err(Refusal::new(
            Stage::Scopes,
            Reason::ScopeMissing,
            format!("missing scope {scope:?} required by {}", tool.name),
        )),
    }
}

/// The first required scope the caller lacks (required scopes are sorted at load).
pub fn missing<'t>(caller: &Caller, tool: &'t ToolVersion) -> Option<&'t str> {
    tool.required_scopes
        .iter()
        .find(|s| !caller.has_scope(s))
        .map(String::as_str)
}

/// What stage 5 checked, for an explanation of a call that passed it.
pub(super) fn explain_passed(tool: &ToolVersion) -> StageTrail {
    let detail = if tool.required_scopes.is_empty() {
        "the tool requires no scope".to_owned()
    } else {
        format!(
            "the caller holds every required scope: {}",
            tool.required_scopes.join(", ")
        )
    };
    StageTrail::new(Stage::Scopes, StageResult::Passed, detail)
}
