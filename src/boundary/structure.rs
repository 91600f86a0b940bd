//! Stages 1 and 2: normalize the call id, then check the call's structure — a tool name, and
//! arguments that are one JSON object within the size and nesting limits. Depth is measured on the
//! raw text without recursion, before anything is parsed.

use serde_json::Value;

use crate::{
    config::LimitsConfig,
    error::{Reason, Refusal, Stage},
};

/// A blank call id becomes `tool_step_<step>_<index>`.
pub fn normalize_call_id(call_id: &str, step: u32, index: usize) -> String {
    let trimmed = call_id.trim();
    if trimmed.is_empty() {
        format!("tool_step_{step}_{index}")
    } else {
        trimmed.to_owned()
    }
}

/// Checks the name and parses the arguments; the value returned is always a JSON object.
pub fn check(name: &str, arguments_json: &str, limits: &LimitsConfig) -> Result<Value, Refusal> {
    let refuse = |reason, message: String| Err(Refusal::new(Stage::Structure, reason, message));
    if name.trim().is_empty() {
        return refuse(Reason::ToolNameMissing, "the call names no tool".into());
    }
    if arguments_json.len() > limits.max_arguments_bytes {
        return refuse(
            Reason::ArgumentsTooLarge,
            format!(
                "arguments are {} bytes; the limit is {}",
                arguments_json.len(),
                limits.max_arguments_bytes
            ),
        );
    }
    if arguments_json.trim().is_empty() {
        return refuse(
            Reason::ArgumentsNotJson,
            "arguments are empty; send a JSON object such as {}".into(),
        );
    }
    if let Some(depth) = exceeds_depth(arguments_json, limits.max_arguments_depth) {
        return refuse(
            Reason::ArgumentsTooDeep,
            format!(
                "arguments nest deeper than {} levels (at least {depth})",
                limits.max_arguments_depth
            ),
        );
    }
    match serde_json::from_str::<Value>(arguments_json) {
        Ok(object @ Value::Object(_)) => Ok(object),
        Ok(other) => refuse(
            Reason::ArgumentsNotObject,
            format!("arguments must be a JSON object, not {}", kind(&other)),
        ),
        Err(err) => refuse(
            Reason::ArgumentsNotJson,
            format!("arguments are not valid JSON: {err}"),
        ),
    }
}

/// Returns the depth reached once it passes `max`, scanning brackets outside strings.
fn exceeds_depth(text: &str, max: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return Some(depth);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> LimitsConfig {
        LimitsConfig {
            max_arguments_bytes: 64,
            max_arguments_depth: 3,
            ..LimitsConfig::default()
        }
    }

    fn reason(name: &str, args: &str) -> Reason {
        check(name, args, &limits()).unwrap_err().reason
    }

    #[test]
    fn blank_call_ids_are_numbered_by_step_and_index() {
        assert_eq!(normalize_call_id("  ", 4, 2), "tool_step_4_2");
        assert_eq!(normalize_call_id("call-7", 4, 2), "call-7");
    }

    #[test]
    fn structure_refusals() {
        assert_eq!(reason(" ", "{}"), Reason::ToolNameMissing);
        assert_eq!(reason("t", ""), Reason::ArgumentsNotJson);
        assert_eq!(reason("t", "{"), Reason::ArgumentsNotJson);
        assert_eq!(reason("t", "[1]"), Reason::ArgumentsNotObject);
        assert_eq!(reason("t", &"x".repeat(65)), Reason::ArgumentsTooLarge);
        assert_eq!(
            reason("t", r#"{"a":{"b":{"c":{}}}}"#),
            Reason::ArgumentsTooDeep
        );
        assert_eq!(check("t", "{}", &limits()).unwrap(), serde_json::json!({}));
        // Brackets inside strings do not count.
        assert!(check("t", r#"{"a":"[[[[{{{{\"]]"}"#, &limits()).is_ok());
    }
}
