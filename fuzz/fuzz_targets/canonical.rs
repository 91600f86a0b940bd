//! Canonical JSON and its SHA-256 on arbitrary parsed values. Approvals and idempotency compare
//! these hashes, so: the canonical text is valid JSON, canonicalizing it again changes nothing, and
//! re-spelling the same value (other key order, whitespace, serde_json's own number spelling)
//! never changes the hash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use toolgate::canonical::{sha256_hex, to_string};

/// The same value with every object's keys in reverse order.
fn reversed(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .rev()
                .map(|(k, v)| (k.clone(), reversed(v)))
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let text = to_string(&value);
    let hash = sha256_hex(&value);
    assert_eq!(hash.len(), 64);
    assert_eq!(
        to_string(&value),
        text,
        "canonical text is not deterministic"
    );

    let reparsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("canonical text is not JSON ({e}): {text}"));
    assert_eq!(
        to_string(&reparsed),
        text,
        "canonicalizing the canonical text changed it"
    );

    for respelled in [
        serde_json::to_string(&value).unwrap(),
        serde_json::to_string_pretty(&value).unwrap(),
        serde_json::to_string(&reversed(&value)).unwrap(),
    ] {
        let again: Value = serde_json::from_str(&respelled).unwrap();
        assert_eq!(
            sha256_hex(&again),
            hash,
            "{respelled} and {} hash differently",
            String::from_utf8_lossy(data)
        );
    }
});
