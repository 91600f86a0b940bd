//! What records may carry of a call's arguments: a copy with the tool's `redact` values
//! replaced, and a backend's free text with those values taken out too.

/// Free text (a backend's error) with every value found at the `redact` pointers replaced, so a
/// redacted argument echoed back by the backend is not recorded either.
pub(super) fn redact_text(
    text: &str,
    arguments: &serde_json::Value,
    pointers: &[String],
) -> String {
    fn leaves(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::String(s) if !s.is_empty() => out.push(s.clone()),
            serde_json::Value::Number(n) => out.push(n.to_string()),
            serde_json::Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
            serde_json::Value::Object(map) => map.values().for_each(|v| leaves(v, out)),
            _ => {}
        }
    }
    let mut secrets = Vec::new();
    for pointer in pointers {
        if let Some(value) = arguments.pointer(pointer) {
            leaves(value, &mut secrets);
        }
    }
    // Longest first, so a secret containing another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.to_owned();
    for secret in secrets {
        text = text.replace(&secret, "[redacted]");
    }
    text
}

/// A copy of the arguments with the values at these JSON pointers replaced.
pub(super) fn redact(arguments: &serde_json::Value, pointers: &[String]) -> serde_json::Value {
    let mut copy = arguments.clone();
    for pointer in pointers {
        if let Some(value) = copy.pointer_mut(pointer) {
            *value = serde_json::Value::from("[redacted]");
        }
    }
    copy
}
