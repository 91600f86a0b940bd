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
/// Longest text kept of one violation (an `additionalProperties` violation names every key).
const MAX_VIOLATION_CHARS: usize = 300;

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
        .map(|err| describe(&err))
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

/// One violation: its JSON pointer and what is wrong, masked — argument values (which may be
/// secrets) never reach messages, logs or audit — and bounded in length.
fn describe(err: &jsonschema::ValidationError<'_>) -> String {
    let pointer = err.instance_path().as_str();
    let at = if pointer.is_empty() { "/" } else { pointer };
    shorten(format!("{at}: {}", err.masked()))
}

/// Keeps a violation's text bounded, whatever the size of the arguments.
fn shorten(text: String) -> String {
    match text.char_indices().nth(MAX_VIOLATION_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// After binding: the final arguments must satisfy the tool's full schema, so the backend never
/// receives what the catalog does not allow — e.g. model-chosen keys inside an object the server
/// binds (that object is hidden from the model, so the visible schema cannot speak for it).
pub fn check_bound(tool: &ToolVersion, arguments: &Value) -> Result<(), Refusal> {
    let Some(full) = &tool.full_validator else {
        return Ok(());
    };
    let violations: Vec<String> = full
        .iter_errors(arguments)
        .take(MAX_LISTED)
        .map(|err| describe(&err))
        .collect();
    if violations.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        Stage::Bind,
        Reason::SchemaViolation,
        format!(
            "the arguments do not fit the tool's schema once server-bound values are added: {}",
            violations.join("; ")
        ),
    ))
}
