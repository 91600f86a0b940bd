//! Stage 6: the model's arguments against the tool's visible JSON Schema, reporting every
//! violation with its JSON pointer. Bound keys are left out of this check: whether the model may
//! send them is the bind stage's decision, so it is explained as such.

use serde_json::Value;

use super::{
    bind,
    explain::{StageResult, StageTrail},
};
use crate::{
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage},
};

/// Most violations listed in one message; the count says how many there were.
const MAX_LISTED: usize = 20;
/// Longest text kept of one violation (an `additionalProperties` violation names every key).
const MAX_VIOLATION_CHARS: usize = 300;

pub fn check(tool: &ToolVersion, arguments: &Value) -> Result<(), Refusal> {
    check_listing(tool, arguments, &mut Vec::new())
}

/// [`check`], leaving the violations it lists in `found` (for explanations).
pub fn check_listing(
    tool: &ToolVersion,
    arguments: &Value,
    found: &mut Vec<String>,
) -> Result<(), Refusal> {
    let without_bound;
    let instance = match arguments.as_object() {
        // Copy only in the rare case the model sent bound keys.
        Some(map) if bind::sends_bound(tool, map) => {
            without_bound = Value::Object(bind::without_bound(tool, map));
            &without_bound
        }
        _ => arguments,
    };
    // Valid arguments are the common case: one pass that stops at the first error.
    if tool.validator.is_valid(instance) {
        return Ok(());
    }
    let mut violations = violations(&tool.validator, instance);
    let more = violations.len() > MAX_LISTED;
    violations.truncate(MAX_LISTED);
    let listed = violations.join("; ");
    let message = if more {
        format!("more than {MAX_LISTED} schema violations; the first {MAX_LISTED}: {listed}")
    } else {
        format!("arguments do not match the schema: {listed}")
    };
    found.extend(violations);
    Err(Refusal::new(
        Stage::Schema,
        Reason::SchemaViolation,
        message,
    ))
}

/// Up to `MAX_LISTED + 1` violations, described. jsonschema collects every violation before
/// handing out the first, and a megabyte of arguments can hold half a million (a second of CPU,
/// hundreds of MiB): small instances get every violation listed; larger ones get the first, found
/// by a validation that stops there.
fn violations(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    if nodes_within(instance, MAX_NODES_FOR_ALL_VIOLATIONS) {
        return validator
            .iter_errors(instance)
            .take(MAX_LISTED + 1)
            .map(|err| describe(&err))
            .collect();
    }
    match validator.validate(instance) {
        Ok(()) => Vec::new(),
        Err(err) => vec![format!(
            "{} (the arguments are too large to list every violation; this is the first)",
            describe(&err)
        )],
    }
}

/// Arguments with at most this many JSON values get every violation listed (up to the cap).
const MAX_NODES_FOR_ALL_VIOLATIONS: usize = 2000;

/// Whether `value` holds at most `max` JSON values, counted without recursion and stopping early.
fn nodes_within(value: &Value, max: usize) -> bool {
    let mut pending = vec![value];
    let mut seen = 0usize;
    while let Some(value) = pending.pop() {
        seen += 1;
        if seen > max {
            return false;
        }
        let children = match value {
            Value::Array(items) => items.len(),
            Value::Object(map) => map.len(),
            _ => 0,
        };
        if seen + pending.len() + children > max {
            return false;
        }
        match value {
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => pending.extend(map.values()),
            _ => {}
        }
    }
    true
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
    check_bound_listing(tool, arguments, &mut Vec::new())
}

/// [`check_bound`], leaving the violations it lists in `found` (for explanations).
pub fn check_bound_listing(
    tool: &ToolVersion,
    arguments: &Value,
    found: &mut Vec<String>,
) -> Result<(), Refusal> {
    let Some(full) = &tool.full_validator else {
        return Ok(());
    };
    if full.is_valid(arguments) {
        return Ok(());
    }
    let mut violations = violations(full, arguments);
    violations.truncate(MAX_LISTED);
    if violations.is_empty() {
        return Ok(());
    }
    let refusal = Refusal::new(
        Stage::Bind,
        Reason::SchemaViolation,
        format!(
            "the arguments do not fit the tool's schema once server-bound values are added: {}",
            violations.join("; ")
        ),
    );
    found.extend(violations);
    Err(refusal)
}

/// What stage 6 checked, for an explanation of a call that passed it.
pub(super) fn explain_passed() -> StageTrail {
    StageTrail::new(
        Stage::Schema,
        StageResult::Passed,
        "the arguments match the tool's input schema",
    )
}
