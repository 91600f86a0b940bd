//! Canonical JSON: object keys sorted, numbers in one spelling, no whitespace. Two argument objects
//! that mean the same hash the same, whatever key order or number formatting the model chose.

use std::io::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The value in canonical form: object keys sorted, integral numbers as integers. Serializing it
/// gives exactly [`to_string`]'s text, so a backend that receives it gets what was hashed (and
/// approved): `{"amount_cents": 2500.0}` becomes `2500`, never a float a tool reads as nothing.
pub fn normalize(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(integer) = integral(n) {
                *n = integer;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(normalize);
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// A float with no fractional part, within the exactly representable range, as an integer.
fn integral(n: &serde_json::Number) -> Option<serde_json::Number> {
    if n.is_i64() || n.is_u64() {
        return None;
    }
    let f = n.as_f64()?;
    // 2^53: beyond it not every integer is representable, so keep the float spelling.
    (f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0)
        .then(|| serde_json::Number::from(f as i64))
}

/// The canonical JSON text of a value.
pub fn to_string(value: &Value) -> String {
    let mut out = Vec::new();
    write_value(value, &mut out);
    // Only JSON text was written: strings through serde_json, the rest ASCII.
    String::from_utf8(out)
        .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
}

/// SHA-256 (lowercase hex) of the canonical JSON text.
pub fn sha256_hex(value: &Value) -> String {
    let mut text = Vec::new();
    write_value(value, &mut text);
    lower_hex(&Sha256::digest(&text))
}

/// Lowercase hex of `bytes`, written in one pass (`hex::encode` collects it a `char` at a time,
/// which cost more than the SHA-256 it printed on the call path).
pub fn lower_hex(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    // The buffer is exactly twice as long, so encoding cannot fail, and hex digits are ASCII.
    let _ = hex::encode_to_slice(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_value(item, out);
            }
            out.push(b'}');
        }
    }
}

/// Integers print as integers whichever way they were written (`1`, `1.0`, `1e0`); other numbers
/// in the shortest form that reads back to the same f64. Writing to a `Vec` cannot fail.
fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        // 2^53: beyond it not every integer is representable, so keep the float spelling.
        if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
            let _ = write!(out, "{}", f as i64);
        } else {
            let _ = serde_json::to_writer(&mut *out, &f);
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's own escaping is already deterministic; it writes straight into the buffer.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_hex_matches_the_hex_crate() {
        for bytes in [&b""[..], b"\x00\xff\x10", &[0xab; 32]] {
            assert_eq!(lower_hex(bytes), hex::encode(bytes));
        }
    }
    use serde_json::json;

    #[test]
    fn key_order_whitespace_and_number_spelling_do_not_matter() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1.0, "a": [2, {"y": 1e0, "x": "é"}]}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":[2,{"x":"\u00e9","y":1}],"b":1}"#).unwrap();
        assert_eq!(to_string(&a), r#"{"a":[2,{"x":"é","y":1}],"b":1}"#);
        assert_eq!(sha256_hex(&a), sha256_hex(&b));
    }

    #[test]
    fn normalized_values_serialize_as_their_canonical_text() {
        let mut value: Value =
            serde_json::from_str(r#"{"b": 2500.0, "a": [1.5, {"y": 1e0, "x": -3.0}], "c": 1e300}"#)
                .unwrap();
        let canonical = to_string(&value);
        normalize(&mut value);
        assert_eq!(serde_json::to_string(&value).unwrap(), canonical);
        assert_eq!(value["b"].as_u64(), Some(2500));
        assert_eq!(value["a"][1]["x"].as_i64(), Some(-3));
    }

    #[test]
    fn different_values_hash_differently() {
        assert_ne!(sha256_hex(&json!({"a": 1})), sha256_hex(&json!({"a": 1.5})));
        assert_ne!(sha256_hex(&json!({"a": "1"})), sha256_hex(&json!({"a": 1})));
    }
}
