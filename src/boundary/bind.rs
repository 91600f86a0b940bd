//! Stage 7: server-bound arguments. Values the catalog binds (e.g. a RAG tool's tenant filter)
//! come from the caller's identity or constants, never from the model. A model that sends a bound
//! key itself is refused, or overwritten where the tool says so; either way the attempt is noted
//! for the audit trail.

use serde_json::{Map, Value};

use super::{
    explain::{BoundValue, StageResult, StageTrail},
    redaction::redact,
};
use crate::{
    catalog::{BindValue, Binding, BoundOverride, ToolVersion},
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

/// Whether the model sent a value at, or above, any bound path.
pub fn sends_bound(tool: &ToolVersion, arguments: &Map<String, Value>) -> bool {
    tool.bindings.iter().any(|b| present(arguments, &b.path))
}

/// The bound paths the model sent, dotted.
pub fn attempted(tool: &ToolVersion, arguments: &Map<String, Value>) -> Vec<String> {
    tool.bindings
        .iter()
        .filter(|b| present(arguments, &b.path))
        .map(|b| b.dotted.clone())
        .collect()
}

/// A model value "at" a bound path means: the leaf itself, or a non-object where an object on the
/// path should be (which would otherwise be replaced silently).
fn present(arguments: &Map<String, Value>, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    match arguments.get(first) {
        None => false,
        Some(_) if rest.is_empty() => true,
        Some(Value::Object(child)) => present(child, rest),
        Some(_) => true,
    }
}

/// The arguments with every bound leaf removed, and objects emptied by that removed too — the
/// same shape the visible schema has (for validation).
pub fn without_bound(tool: &ToolVersion, arguments: &Map<String, Value>) -> Map<String, Value> {
    let mut copy = arguments.clone();
    for binding in &tool.bindings {
        remove(&mut copy, &binding.path);
    }
    copy
}

/// Removes the value at `path`; a parent object left empty by that goes too.
fn remove(map: &mut Map<String, Value>, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let remove_here = match map.get_mut(first) {
        Some(Value::Object(child)) if !rest.is_empty() => {
            remove(child, rest);
            child.is_empty()
        }
        Some(_) => true,
        None => false,
    };
    if remove_here {
        map.shift_remove(first);
    }
}

/// Writes the bound values and returns the final arguments; refuses a model that sent bound keys
/// unless the tool overwrites them. (The chain records [`attempted`] before this runs.)
pub fn apply(tool: &ToolVersion, caller: &Caller, mut arguments: Value) -> Result<Value, Refusal> {
    let Some(map) = arguments.as_object_mut() else {
        return Err(Refusal::new(
            Stage::Bind,
            Reason::Internal,
            "arguments are not an object",
        ));
    };
    let override_attempts = attempted(tool, map);
    if !override_attempts.is_empty() && tool.on_bound_argument == BoundOverride::Deny {
        return Err(Refusal::new(
            Stage::Bind,
            Reason::BoundArgumentOverride,
            format!(
                "argument {} is set by the server and may not be sent by the model",
                override_attempts.join(", ")
            ),
        ));
    }
    for binding in &tool.bindings {
        set(map, binding, value_for(&binding.value, caller));
    }
    Ok(arguments)
}

fn value_for(value: &BindValue, caller: &Caller) -> Value {
    match value {
        BindValue::CallerTenant => Value::from(&*caller.tenant),
        BindValue::CallerSubject => Value::from(caller.subject.as_str()),
        BindValue::CallerAgent => Value::from(&*caller.agent),
        BindValue::Constant(v) => v.clone(),
    }
}

fn set(map: &mut Map<String, Value>, binding: &Binding, value: Value) {
    let mut current = map;
    let (last, parents) = match binding.path.split_last() {
        Some(split) => split,
        None => return,
    };
    for segment in parents {
        let entry = current
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        let Value::Object(next) = entry else { return };
        current = next;
    }
    current.insert(last.clone(), value);
}

/// What stage 7 wrote, for an explanation: each bound value as it stands in the (redacted)
/// final `arguments`, and the model's own values it overwrote.
pub(super) fn explain_passed(
    tool: &ToolVersion,
    arguments: &Value,
    overwritten: &[String],
) -> StageTrail {
    let redacted = redact(arguments, &tool.redact);
    let bound: Vec<BoundValue> = tool
        .bindings
        .iter()
        .map(|binding| {
            let mut at = Some(&redacted);
            for segment in &binding.path {
                at = at.and_then(|v| v.get(segment));
            }
            BoundValue {
                path: binding.dotted.clone(),
                value: at.cloned().unwrap_or(Value::Null),
                source: match binding.value {
                    BindValue::CallerTenant => "${caller.tenant}",
                    BindValue::CallerSubject => "${caller.subject}",
                    BindValue::CallerAgent => "${caller.agent}",
                    BindValue::Constant(_) => "constant",
                },
            }
        })
        .collect();
    let mut detail = if bound.is_empty() {
        "the tool binds no argument".to_owned()
    } else {
        let listed: Vec<String> = bound
            .iter()
            .map(|b| format!("{} = {} (from {})", b.path, b.value, b.source))
            .collect();
        format!("the server writes {}", listed.join(", "))
    };
    if !overwritten.is_empty() {
        detail.push_str(&format!(
            "; the model's own {} was overwritten (audited)",
            overwritten.join(", ")
        ));
    }
    StageTrail {
        bound,
        ..StageTrail::new(Stage::Bind, StageResult::Passed, detail)
    }
}
