//! Stage 5: the caller holds every scope the tool requires.

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
