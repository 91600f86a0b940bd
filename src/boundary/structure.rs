//! Stages 1 and 2: normalize the call id, then check the call's structure — identifiers within
//! their length limit and printable ASCII, a tool name, and arguments that are one JSON object
//! within the size and nesting limits. Depth and values are counted on the raw text without
//! recursion, before anything is parsed; what the parsed arguments will take is then charged to
//! the sidecar's [`ArgumentsBudget`] for the rest of the call.

use std::{borrow::Cow, sync::Arc};

use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::explain::{StageResult, StageTrail};
use crate::{
    error::{Reason, Refusal, Stage},
    settings::{LimitsConfig, parsed_arguments_bytes},
};

/// What the calls in flight may hold of parsed arguments (`limits.max_parsed_arguments_bytes_in_flight`):
/// a call takes its share before its arguments are parsed and keeps it until it ends, so many
/// slow calls with large arguments cannot hold more than this between them.
#[derive(Debug)]
pub struct ArgumentsBudget {
    units: Arc<Semaphore>,
    max_bytes: usize,
}

/// Charged in units of this many bytes.
const UNIT: usize = 1024;

/// A call's share of the [`ArgumentsBudget`], given back when dropped.
#[derive(Debug)]
pub struct ArgumentsHeld {
    _permit: OwnedSemaphorePermit,
    bytes: usize,
}

impl ArgumentsHeld {
    /// The bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl ArgumentsBudget {
    pub fn new(max_bytes: usize) -> Self {
        ArgumentsBudget {
            units: Arc::new(Semaphore::new(
                (max_bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS),
            )),
            max_bytes,
        }
    }

    /// Takes `bytes` for a call, or refuses it as `overloaded` (retryable) when the calls in
    /// flight hold too much already.
    pub fn take(&self, bytes: usize) -> Result<ArgumentsHeld, Refusal> {
        let units = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX);
        match self.units.clone().try_acquire_many_owned(units) {
            Ok(permit) => Ok(ArgumentsHeld {
                _permit: permit,
                bytes,
            }),
            Err(_) => Err(Refusal::new(
                Stage::Structure,
                Reason::Overloaded,
                format!(
                    "the calls in flight hold {} bytes of parsed arguments (limits.max_parsed_arguments_bytes_in_flight); retry shortly",
                    self.max_bytes
                ),
            )),
        }
    }
}

/// A blank call id becomes `tool_step_<step>_<index>`.
pub fn normalize_call_id(call_id: &str, step: u32, index: usize) -> Cow<'_, str> {
    let trimmed = call_id.trim();
    if trimmed.is_empty() {
        // Without `format!`: clients that send no ids pay this on every call.
        let (mut step_digits, mut index_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (step, index) = (step_digits.format(step), index_digits.format(index));
        let mut generated = String::with_capacity(11 + step.len() + index.len());
        generated.push_str("tool_step_");
        generated.push_str(step);
        generated.push('_');
        generated.push_str(index);
        Cow::Owned(generated)
    } else {
        Cow::Borrowed(trimmed)
    }
}

/// Whether a client-chosen identifier (call id, run id, idempotency key, approval id, tool name)
/// is acceptable: within `max` bytes and printable ASCII. Identifiers travel on in headers, logs
/// and audit lines, where a control character breaks or forges what follows.
pub fn check_identifier(field: &str, value: &str, max: usize) -> Result<(), (Reason, String)> {
    if value.len() > max {
        return Err((
            Reason::IdentifierTooLong,
            format!("{field} is {} bytes; the limit is {max}", value.len()),
        ));
    }
    if let Some(position) = value.bytes().position(|b| !(b' '..=b'~').contains(&b)) {
        return Err((
            Reason::IdentifierInvalid,
            format!("{field} must be printable ASCII; byte {position} is not"),
        ));
    }
    Ok(())
}

/// The identifiers of one call, checked before anything else is read.
pub fn check_identifiers(
    fields: &[(&str, Option<&str>)],
    limits: &LimitsConfig,
) -> Result<(), Refusal> {
    for (field, value) in fields {
        if let Some(value) = value {
            check_identifier(field, value, limits.max_identifier_bytes)
                .map_err(|(reason, message)| Refusal::new(Stage::Structure, reason, message))?;
        }
    }
    Ok(())
}

/// A call id to report back and record: the client's own, cut to the identifier limit when it is
/// over (the call is then refused for it), so a refusal never echoes an unbounded string.
/// Shared: the call's audit event, span and permit hold the same copy.
pub fn reported_call_id(call_id: &str, limit: usize) -> Arc<str> {
    Arc::from(super::truncate_utf8(call_id, limit))
}

/// Checks the name and parses the arguments, charging what they will take parsed to `budget`
/// first; the value returned is always a JSON object.
pub fn check(
    name: &str,
    arguments_json: &str,
    limits: &LimitsConfig,
    budget: &ArgumentsBudget,
) -> Result<(Value, ArgumentsHeld), Refusal> {
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
    let values = match scan(
        arguments_json,
        limits.max_arguments_depth,
        limits.max_arguments_values,
    ) {
        Err(Exceeded::Depth(depth)) => {
            return refuse(
                Reason::ArgumentsTooDeep,
                format!(
                    "arguments nest deeper than {} levels (at least {depth})",
                    limits.max_arguments_depth
                ),
            );
        }
        // Each parsed value takes ~72 bytes: a megabyte of `1,1,1,…` would take 40 MiB.
        Err(Exceeded::Values) => {
            return refuse(
                Reason::ArgumentsTooLarge,
                format!(
                    "arguments hold more than {} JSON values",
                    limits.max_arguments_values
                ),
            );
        }
        Ok(values) => values,
    };
    // Charged before parsing: the parse itself is what would take the memory.
    let held = budget.take(parsed_arguments_bytes(arguments_json.len(), values))?;
    match serde_json::from_str::<Value>(arguments_json) {
        Ok(object @ Value::Object(_)) => Ok((object, held)),
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

/// What the raw text is over, found before parsing.
#[derive(Debug, PartialEq, Eq)]
enum Exceeded {
    /// Nesting passed the limit, at this depth.
    Depth(usize),
    /// More values than the limit (counted as separators and openings, an upper bound).
    Values,
}

/// Scans brackets and separators outside strings: the depth reached once it passes `max_depth`,
/// or whether the text can hold more than `max_values` values (each value after the first
/// follows a `,` or opens a container, so their count bounds it); within both, that bound.
fn scan(text: &str, max_depth: usize, max_values: usize) -> Result<usize, Exceeded> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut values = 1usize;
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        at += 1;
        match byte {
            // A string: jump from quote or backslash to the next (SIMD search), not byte by
            // byte; most of the arguments' bytes are string contents. An escape's next byte is
            // never the end of the string. Unterminated: nothing more to count.
            b'"' => loop {
                let Some(found) = bytes
                    .get(at..)
                    .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
                else {
                    return Ok(values);
                };
                let special = bytes[at + found];
                at += found + 1;
                if special == b'"' {
                    break;
                }
                at += 1;
            },
            b'{' | b'[' => {
                depth += 1;
                values += 1;
                if depth > max_depth {
                    return Err(Exceeded::Depth(depth));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' => values += 1,
            _ => {}
        }
        if values > max_values {
            return Err(Exceeded::Values);
        }
    }
    Ok(values)
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

/// What stage 1 checked, for an explanation of a call that passed it.
pub(super) fn explain_passed() -> StageTrail {
    StageTrail::new(
        Stage::Structure,
        StageResult::Passed,
        "identifiers are printable and within their limits; the arguments are one JSON object within the size, depth and value limits",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan as first written, byte by byte: the reference for the one that skips strings.
    fn scan_bytewise(text: &str, max_depth: usize, max_values: usize) -> Result<usize, Exceeded> {
        let (mut depth, mut values, mut in_string, mut escaped) = (0usize, 1usize, false, false);
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
                    values += 1;
                    if depth > max_depth {
                        return Err(Exceeded::Depth(depth));
                    }
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                b',' => values += 1,
                _ => {}
            }
            if values > max_values {
                return Err(Exceeded::Values);
            }
        }
        Ok(values)
    }

    #[test]
    fn skipping_strings_counts_exactly_as_reading_every_byte() {
        let pieces = [
            "{", "}", "[", "]", ",", "\"", "\\", "\\\"", "a", "1", ":", " ", "\"[,{\"", "é",
        ];
        // Every sequence of up to four pieces, under limits that trip and limits that do not.
        let mut texts = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = texts
                .iter()
                .flat_map(|t| pieces.iter().map(move |p| format!("{t}{p}")))
                .collect();
            texts.extend(longer);
        }
        texts.push(r#"{"a":"x\\\"[[[","b":[1,2,{"c":"\\"}],"d":"unterminated [,"#.into());
        for text in &texts {
            for (depth, values) in [(2, 3), (64, 10_000)] {
                assert_eq!(
                    scan(text, depth, values),
                    scan_bytewise(text, depth, values),
                    "{text:?}"
                );
            }
        }
    }

    fn limits() -> LimitsConfig {
        LimitsConfig {
            max_arguments_bytes: 64,
            max_arguments_depth: 3,
            max_arguments_values: 8,
            ..LimitsConfig::default()
        }
    }

    fn budget() -> ArgumentsBudget {
        ArgumentsBudget::new(1 << 20)
    }

    fn reason(name: &str, args: &str) -> Reason {
        check(name, args, &limits(), &budget()).unwrap_err().reason
    }

    #[test]
    fn parsed_arguments_are_charged_before_parsing_and_given_back_when_dropped() {
        let limits = LimitsConfig::default();
        let args = r#"{"a":[1,2,3]}"#;
        // The text and 80 bytes for each of its (at most) 5 values, in whole KiB.
        let budget = ArgumentsBudget::new(2 * 1024);
        let (_, first) = check("t", args, &limits, &budget).unwrap();
        assert_eq!(first.bytes(), args.len() + 5 * 80);
        let (_, second) = check("t", args, &limits, &budget).unwrap();
        let refused = check("t", args, &limits, &budget).unwrap_err();
        assert_eq!(refused.reason, Reason::Overloaded);
        assert!(refused.retryable);
        assert!(
            refused
                .message
                .contains("max_parsed_arguments_bytes_in_flight")
        );
        drop((first, second));
        assert!(check("t", args, &limits, &budget).is_ok(), "given back");
    }

    #[test]
    fn blank_call_ids_are_numbered_by_step_and_index() {
        assert_eq!(normalize_call_id("  ", 4, 2), "tool_step_4_2");
        assert_eq!(
            normalize_call_id("", u32::MAX, 1_234_567),
            "tool_step_4294967295_1234567"
        );
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
        assert_eq!(
            check("t", "{}", &limits(), &budget()).unwrap().0,
            serde_json::json!({})
        );
        assert_eq!(
            reason("t", r#"{"a":[1,2,3,4,5,6,7,8]}"#),
            Reason::ArgumentsTooLarge
        );
        assert!(
            check(
                "t",
                r#"{"a":[1,2,3],"b":"x,y,z,w,v,u,t,s"}"#,
                &limits(),
                &budget()
            )
            .is_ok()
        );
        let too_long = "x".repeat(257);
        let bad = [
            ("call_id", Some("a\u{1b}[2J")),
            ("run_id", Some("tab\there")),
            ("idempotency_key", Some(too_long.as_str())),
        ];
        for (field, value) in bad {
            let refusal = check_identifiers(&[(field, value)], &limits()).unwrap_err();
            assert!(refusal.message.starts_with(field), "{}", refusal.message);
        }
        assert!(
            check_identifiers(&[("call_id", Some("call-1 ok")), ("x", None)], &limits()).is_ok()
        );
        // Brackets inside strings do not count.
        assert!(check("t", r#"{"a":"[[[[{{{{\"]]"}"#, &limits(), &budget()).is_ok());
    }
}
