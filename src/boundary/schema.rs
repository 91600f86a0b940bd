//! Stage 6: the model's arguments against the tool's visible JSON Schema, reporting every
//! violation with its JSON pointer. Bound keys are left out of this check: whether the model may
//! send them is the bind stage's decision, so it is explained as such.

use serde_json::Value;

use super::bind;
use crate::{
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage},
};

/// Most violations listed in one message; the count says how many there were.
const MAX_LISTED: usize = 20;

pub fn check(tool: &ToolVersion, arguments: &Value) -> Result<(), Refusal> {
    let without_bound;
    let instance = match arguments.as_object() {
        // Copy only in the rare case the model sent bound keys.
        Some(map) if bind::sends_bound(tool, map) => {
            without_bound = Value::Object(bind::without_bound(tool, map));
            &without_bound
        }
        _ => arguments,
    };
    let violations: Vec<String> = tool
        .validator
        .iter_errors(instance)
        .map(|err| {
            let pointer = err.instance_path().as_str();
            let at = if pointer.is_empty() { "/" } else { pointer };
            // Masked: argument values (which may be secrets) never reach messages, logs or audit.
            format!("{at}: {}", err.masked())
        })
        .collect();
    if violations.is_empty() {
        return Ok(());
    }
    let listed = violations
        .iter()
        .take(MAX_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    let more = violations.len().saturating_sub(MAX_LISTED);
    let message = if more > 0 {
        format!(
            "{} schema violations: {listed}; and {more} more",
            violations.len()
        )
    } else {
        format!("arguments do not match the schema: {listed}")
    };
    Err(Refusal::new(
        Stage::Schema,
        Reason::SchemaViolation,
        message,
    ))
}
