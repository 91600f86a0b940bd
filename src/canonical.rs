//! Canonical JSON: object keys sorted, numbers in one spelling, no whitespace. Two argument objects
//! that mean the same hash the same, whatever key order or number formatting the model chose.

use std::{io::Write as _, sync::Arc};

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

/// Room for a typical call's canonical arguments, allocated once instead of grown.
const TYPICAL_TEXT_BYTES: usize = 512;

/// The canonical JSON text of a value.
pub fn to_string(value: &Value) -> String {
    let mut out = Vec::with_capacity(TYPICAL_TEXT_BYTES);
    write_value(value, &mut out);
    // Only JSON text was written: strings through serde_json, the rest ASCII.
    String::from_utf8(out)
        .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
}

/// SHA-256 (lowercase hex) of the canonical JSON text.
pub fn sha256_hex(value: &Value) -> String {
    sha256_hex_shared(value).to_string()
}

/// [`sha256_hex`], made once to be shared: a call's audit event, idempotency record and approval
/// binding all hold its arguments' hash. The hex is written on the stack, not in a `String`.
pub fn sha256_hex_shared(value: &Value) -> Arc<str> {
    let mut text = Vec::with_capacity(TYPICAL_TEXT_BYTES);
    write_value(value, &mut text);
    let mut hex = [0; 64];
    // The buffer is exactly twice the digest's length, so encoding cannot fail.
    let _ = hex::encode_to_slice(Sha256::digest(&text), &mut hex);
    Arc::from(std::str::from_utf8(&hex).unwrap_or_default())
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
            out.push(b'{');
            // Arguments are hashed after `normalize`, which sorts every object's keys in place:
            // then they are written in their order, without collecting and sorting them again.
            if map.keys().is_sorted() {
                write_entries(map.iter(), out);
            } else {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                write_entries(entries.into_iter(), out);
            }
            out.push(b'}');
        }
    }
}

/// An object's members, in the order given.
fn write_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    for (i, (key, item)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(key, out);
        out.push(b':');
        write_value(item, out);
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

/// A JSON string exactly as serde_json writes it (`"` and `\\` escaped, `\b \f \n \r \t` short,
/// other control characters as `\u00xx`, everything else as it is), looking at eight bytes at a
/// time for one that needs escaping: serde_json looks at each byte through a table, and the
/// arguments' strings are most of what is hashed.
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Bytes before `written` are in `out`.
    let mut written = 0;
    while let Some(found) = first_needing_escape(&bytes[written..]) {
        let at = written + found;
        out.extend_from_slice(&bytes[written..at]);
        let byte = bytes[at];
        let short = match byte {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            0x08 => Some(b'b'),
            0x0c => Some(b'f'),
            b'\n' => Some(b'n'),
            b'\r' => Some(b'r'),
            b'\t' => Some(b't'),
            _ => None,
        };
        match short {
            Some(letter) => out.extend_from_slice(&[b'\\', letter]),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 0xf)],
                ]);
            }
        }
        written = at + 1;
    }
    out.extend_from_slice(&bytes[written..]);
    out.push(b'"');
}

/// Whether a reader that is not a JSON parser would take `c` for a line break (U+0085, U+2028,
/// U+2029: Python's `splitlines()`, many log viewers) or let it reorder the text around it (the
/// bidirectional controls). JSON allows them raw inside strings; log and audit lines escape them.
pub fn is_line_or_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// Rewrites, in the JSON text of `out` from `from` on, each [`is_line_or_bidi_control`]
/// character as its `\uXXXX` escape. They can only be inside strings (JSON's own syntax is
/// ASCII), where the escape means the same character, so the JSON is unchanged for a parser and
/// one event stays one line for everyone else. Nothing is copied when there is none, the usual
/// case: their UTF-8 encodings all start with 0xC2, 0xD8 or 0xE2.
pub fn escape_line_and_bidi_controls(out: &mut Vec<u8>, from: usize) {
    let Some(first) = out
        .get(from..)
        .and_then(|tail| memchr::memchr3(0xc2, 0xd8, 0xe2, tail))
    else {
        return;
    };
    let start = from + first;
    let Ok(tail) = std::str::from_utf8(&out[start..]) else {
        return;
    };
    if !tail.chars().any(is_line_or_bidi_control) {
        return;
    }
    let mut escaped = Vec::with_capacity(tail.len() + 12);
    for c in tail.chars() {
        if is_line_or_bidi_control(c) {
            let _ = write!(escaped, "\\u{:04x}", u32::from(c));
        } else {
            let mut utf8 = [0u8; 4];
            escaped.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
        }
    }
    out.truncate(start);
    out.extend_from_slice(&escaped);
}

/// Where the first byte that JSON must escape is.
fn first_needing_escape(bytes: &[u8]) -> Option<usize> {
    let needs_escape = |b: &u8| *b < 0x20 || *b == b'"' || *b == b'\\';
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in chunks.by_ref() {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        if any_byte_needs_escape(u64::from_le_bytes(word)) {
            return chunk.iter().position(needs_escape).map(|i| offset + i);
        }
        offset += 8;
    }
    // The last few bytes, padded with spaces (which need no escape) to one word.
    let tail = chunks.remainder();
    let mut word = [b' '; 8];
    word[..tail.len()].copy_from_slice(tail);
    if any_byte_needs_escape(u64::from_le_bytes(word)) {
        return tail.iter().position(needs_escape).map(|i| offset + i);
    }
    None
}

/// Whether any of eight bytes is a control character, `"` or `\\` (the classic "has a byte less
/// than n" and "has a zero byte" tricks; exact as a yes/no answer).
fn any_byte_needs_escape(chunk: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let less_than = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS;
    let control = less_than(chunk, 0x20);
    let quote = less_than(chunk ^ (ONES * u64::from(b'"')), 1);
    let backslash = less_than(chunk ^ (ONES * u64::from(b'\\')), 1);
    control | quote | backslash != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_bidi_controls_are_escaped_and_the_json_means_the_same() {
        let text = "a\u{2028}b\u{2029}c\u{85}d\u{202e}e\u{2066}f\u{61c}g é 漢字 \u{2027}";
        let mut out = b"{\"k\":".to_vec();
        write_string(text, &mut out);
        out.push(b'}');
        escape_line_and_bidi_controls(&mut out, 0);
        let line = String::from_utf8(out.clone()).unwrap();
        assert_eq!(line.lines().count(), 1);
        assert!(!line.chars().any(is_line_or_bidi_control), "{line}");
        assert!(
            line.contains("\\u2028") && line.contains("\\u202e"),
            "{line}"
        );
        // U+2027 and other characters stay as they were.
        assert!(line.contains("é 漢字 \u{2027}"), "{line}");
        let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back["k"], text);
        // Nothing to escape: nothing changes; and only what follows `from` is looked at.
        let mut plain = b"{\"k\":\"caf\xc3\xa9\"}".to_vec();
        let before = plain.clone();
        escape_line_and_bidi_controls(&mut plain, 0);
        assert_eq!(plain, before);
        let mut two = "x\u{2028}".as_bytes().to_vec();
        let from = two.len();
        two.extend_from_slice("\"\u{2028}\"".as_bytes());
        escape_line_and_bidi_controls(&mut two, from);
        assert_eq!(String::from_utf8(two).unwrap(), "x\u{2028}\"\\u2028\"");
    }

    #[test]
    fn strings_are_written_exactly_as_serde_json_writes_them() {
        let mut cases: Vec<String> = (0u8..=0x7f).map(|b| char::from(b).to_string()).collect();
        // Every single byte at every position of a chunk, and around chunk edges.
        for b in 0u8..=0x7f {
            for at in 0..17 {
                let mut text: String = "abcdefghijklmnopq".into();
                text.replace_range(at..=at, &char::from(b).to_string());
                cases.push(text);
            }
        }
        cases.extend(
            [
                "",
                "plain text longer than eight bytes",
                "é ü 漢字 \u{1f600} mixed with \"quotes\" and \\ backslashes",
                "\u{7f}\u{80}\u{9f}\u{2028}\u{2029} not escaped by serde_json",
                "tab\there\nnew line\r\u{0}\u{1f}\u{8}\u{c}",
            ]
            .map(str::to_owned),
        );
        cases.push("x".repeat(1000) + "\"" + &"y".repeat(7));
        for text in cases {
            let mut ours = Vec::new();
            write_string(&text, &mut ours);
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(&text).unwrap(),
                "{text:?}"
            );
        }
    }

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
        assert_eq!(*sha256_hex_shared(&a), sha256_hex(&a));
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
