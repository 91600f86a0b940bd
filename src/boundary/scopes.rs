//! Stage 5: the caller holds every scope the tool requires.

use crate::{
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

pub fn check(caller: &Caller, tool: &ToolVersion) -> Result<(), Refusal> {
    match tool.required_scopes.iter().find(|s| !caller.has_scope(s)) {
        None => Ok(()),
        Some(scope) => Err(Refusal::new(
            Stage::Scopes,
            Reason::ScopeMissing,
            format!("missing scope {scope:?} required by {}", tool.name),
        )),
    }
}
