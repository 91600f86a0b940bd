//! Stages 1-2 on arbitrary input: call-id normalization and `structure::check` (name, size, depth
//! measured without recursion, one JSON object). Input: `name \0 arguments_json`, UTF-8 (gRPC
//! strings always are). Besides "never panics", checks the stage against a reference: it admits
//! exactly the JSON objects within the limits, and what it returns is what serde_json parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolgate::{
    boundary::structure::{ArgumentsBudget, check, normalize_call_id},
    settings::LimitsConfig,
};

/// Nesting depth of a parsed value: `{}` and `[]` are 1, scalars 0.
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn reference(name: &str, args: &str, limits: &LimitsConfig) -> bool {
    if name.trim().is_empty() || args.len() > limits.max_arguments_bytes {
        return false;
    }
    match serde_json::from_str::<Value>(args) {
        Ok(value @ Value::Object(_)) => depth(&value) <= limits.max_arguments_depth,
        // serde_json gives up beyond 128 levels; the stage must refuse those too (as too deep).
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (name, args) = text.split_once('\0').unwrap_or(("tool", text));

    let step = data.first().copied().map_or(0, u32::from);
    let id = normalize_call_id(name, step, data.len());
    assert!(!id.is_empty());
    if name.trim().is_empty() {
        assert_eq!(id, format!("tool_step_{step}_{}", data.len()));
    } else {
        assert_eq!(id, name.trim());
    }

    let small = LimitsConfig {
        max_arguments_bytes: 256,
        max_arguments_depth: 4,
        ..LimitsConfig::default()
    };
    for limits in [LimitsConfig::default(), small] {
        let budget = ArgumentsBudget::new(limits.max_parsed_arguments_bytes_in_flight);
        let result = check(name, args, &limits, &budget).map(|(value, _held)| value);
        assert_eq!(
            result.is_ok(),
            reference(name, args, &limits),
            "structure::check disagrees with the reference for {name:?} {args:?}: {result:?}"
        );
        if let Ok(value) = result {
            assert!(value.is_object());
            assert_eq!(value, serde_json::from_str::<Value>(args).unwrap());
        }
    }
});
