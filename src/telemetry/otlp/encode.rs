//! Finished spans written straight to an OTLP `ExportTraceServiceRequest` in protobuf, in one
//! pass over the SDK's `SpanData`. The generic path (opentelemetry-proto's `From<SpanData>` into
//! owned proto structs, grouping through a hash map, then prost, which computes each nested
//! message's length again at every level) cost ~19k instructions per span on the export thread
//! (docs/performance.md); this writes each field once, copying nothing but the bytes.
//!
//! A nested message's length is written in front of it once it is known: one byte is reserved,
//! and in the rare case the body needs a longer length, the body is moved up (a span of a few
//! hundred bytes: two bytes, one short move).
//!
//! The output decodes to exactly what opentelemetry-proto's conversion makes from the same
//! spans (the tests compare the two).

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::{
    Array, InstrumentationScope, KeyValue, Value,
    trace::{SpanContext, SpanId, SpanKind, Status},
};
use opentelemetry_sdk::{
    Resource,
    trace::{SpanData, SpanEvents, SpanLinks},
};

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// `SpanFlags`: the span says whether its parent is remote, and whether it is.
const CONTEXT_HAS_IS_REMOTE: u32 = 0x100;
const CONTEXT_IS_REMOTE: u32 = 0x200;

/// The resource every request carries, encoded once when the exporter is made.
#[derive(Debug, Clone, Default)]
pub struct EncodedResource {
    /// The `Resource` message's body.
    body: Vec<u8>,
    schema_url: String,
}

impl EncodedResource {
    pub fn new(resource: &Resource) -> Self {
        let mut body = Vec::new();
        for (key, value) in resource.iter() {
            nested(&mut body, 1, |buf| key_value(buf, key.as_str(), value));
        }
        EncodedResource {
            body,
            schema_url: resource.schema_url().unwrap_or_default().to_owned(),
        }
    }
}

/// A span's usual encoded size, so its length is written without moving it.
const TYPICAL_SPAN_BYTES: usize = 300;

/// Appends `spans` to `out` as one `ExportTraceServiceRequest`: one `ResourceSpans`, and one
/// `ScopeSpans` per instrumentation scope in the order each first appears. `expected_bytes`, the
/// size of a similar request (the last one), saves moving the whole request to fit its length.
pub fn export_request(
    spans: &[SpanData],
    resource: &EncodedResource,
    expected_bytes: usize,
    out: &mut Vec<u8>,
) {
    nested_sized(out, 1, expected_bytes, |buf| {
        bytes_field(buf, 1, &resource.body, true);
        // Scopes are few (toolgate's spans have one): a scan beats a map.
        let mut scopes: Vec<&InstrumentationScope> = Vec::new();
        for span in spans {
            if !scopes.contains(&&span.instrumentation_scope) {
                scopes.push(&span.instrumentation_scope);
            }
        }
        for scope in scopes {
            nested_sized(buf, 2, expected_bytes, |buf| {
                nested(buf, 1, |buf| instrumentation_scope(buf, scope));
                for span in spans.iter().filter(|s| &s.instrumentation_scope == scope) {
                    nested_sized(buf, 2, TYPICAL_SPAN_BYTES, |buf| span_body(buf, span));
                }
                string_field(buf, 3, scope.schema_url().unwrap_or_default());
            });
        }
        string_field(buf, 3, &resource.schema_url);
    });
}

fn instrumentation_scope(buf: &mut Vec<u8>, scope: &InstrumentationScope) {
    string_field(buf, 1, scope.name());
    string_field(buf, 2, scope.version().unwrap_or_default());
    attributes(buf, 3, scope.attributes());
}

fn span_body(buf: &mut Vec<u8>, span: &SpanData) {
    let context = &span.span_context;
    bytes_field(buf, 1, &context.trace_id().to_bytes(), false);
    bytes_field(buf, 2, &context.span_id().to_bytes(), false);
    trace_state(buf, 3, context);
    if span.parent_span_id != SpanId::INVALID {
        bytes_field(buf, 4, &span.parent_span_id.to_bytes(), false);
    }
    string_field(buf, 5, &span.name);
    uint_field(buf, 6, span_kind(&span.span_kind));
    fixed64_field(buf, 7, nanos(span.start_time));
    fixed64_field(buf, 8, nanos(span.end_time));
    attributes(buf, 9, &span.attributes);
    uint_field(buf, 10, u64::from(span.dropped_attributes_count));
    events(buf, &span.events);
    links(buf, &span.links);
    // Always present, as the SDK's conversion makes it.
    nested(buf, 15, |buf| {
        if let Status::Error { description } = &span.status {
            string_field(buf, 2, description);
        }
        uint_field(buf, 3, status_code(&span.status));
    });
    fixed32_field(
        buf,
        16,
        flags(span.parent_span_is_remote, context.trace_flags().to_u8()),
    );
}

fn events(buf: &mut Vec<u8>, events: &SpanEvents) {
    for event in events.iter() {
        nested(buf, 11, |buf| {
            fixed64_field(buf, 1, nanos(event.timestamp));
            string_field(buf, 2, &event.name);
            attributes(buf, 3, &event.attributes);
            uint_field(buf, 4, u64::from(event.dropped_attributes_count));
        });
    }
    uint_field(buf, 12, u64::from(events.dropped_count));
}

fn links(buf: &mut Vec<u8>, links: &SpanLinks) {
    for link in links.iter() {
        nested(buf, 13, |buf| {
            let context = &link.span_context;
            bytes_field(buf, 1, &context.trace_id().to_bytes(), false);
            bytes_field(buf, 2, &context.span_id().to_bytes(), false);
            trace_state(buf, 3, context);
            attributes(buf, 4, &link.attributes);
            uint_field(buf, 5, u64::from(link.dropped_attributes_count));
            fixed32_field(
                buf,
                6,
                flags(context.is_remote(), context.trace_flags().to_u8()),
            );
        });
    }
    uint_field(buf, 14, u64::from(links.dropped_count));
}

fn trace_state(buf: &mut Vec<u8>, field: u32, context: &SpanContext) {
    let header = context.trace_state().header();
    string_field(buf, field, &header);
}

fn flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    let remote = if parent_is_remote {
        CONTEXT_IS_REMOTE
    } else {
        0
    };
    u32::from(trace_flags) | CONTEXT_HAS_IS_REMOTE | remote
}

fn span_kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn status_code(status: &Status) -> u64 {
    match status {
        Status::Unset => 0,
        Status::Ok => 1,
        Status::Error { .. } => 2,
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn attributes<'a>(
    buf: &mut Vec<u8>,
    field: u32,
    attributes: impl IntoIterator<Item = &'a KeyValue>,
) {
    for attribute in attributes {
        nested(buf, field, |buf| {
            key_value(buf, attribute.key.as_str(), &attribute.value);
        });
    }
}

/// A `KeyValue`'s body; its value is always present.
fn key_value(buf: &mut Vec<u8>, key: &str, value: &Value) {
    string_field(buf, 1, key);
    nested(buf, 2, |buf| any_value(buf, value));
}

/// An `AnyValue`'s body: the oneof's field is written even when it holds the default.
fn any_value(buf: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(text) => {
            tag(buf, 1, LEN);
            length_delimited(buf, text.as_str().as_bytes());
        }
        Value::Bool(b) => {
            tag(buf, 2, VARINT);
            varint(buf, u64::from(*b));
        }
        Value::I64(n) => {
            tag(buf, 3, VARINT);
            // int64: two's complement, as protobuf writes negative numbers.
            varint(buf, *n as u64);
        }
        Value::F64(x) => {
            tag(buf, 4, FIXED64);
            buf.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        Value::Array(array) => nested(buf, 5, |buf| match array {
            Array::Bool(values) => array_values(buf, values, |b| Value::Bool(*b)),
            Array::I64(values) => array_values(buf, values, |n| Value::I64(*n)),
            Array::F64(values) => array_values(buf, values, |x| Value::F64(*x)),
            Array::String(values) => {
                for text in values {
                    nested(buf, 1, |buf| {
                        tag(buf, 1, LEN);
                        length_delimited(buf, text.as_str().as_bytes());
                    });
                }
            }
            // A kind of array this encoder does not know: sent empty rather than guessed.
            _ => {}
        }),
        // A kind of value this encoder does not know: an empty `AnyValue`.
        _ => {}
    }
}

fn array_values<T>(buf: &mut Vec<u8>, values: &[T], to_value: impl Fn(&T) -> Value) {
    for value in values {
        nested(buf, 1, |buf| any_value(buf, &to_value(value)));
    }
}

/// A message field: its tag, its length, then the body `write` appends.
fn nested(buf: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    nested_sized(buf, field, 0, write);
}

/// [`nested`], with room for the length reserved at the width `expected` bytes of body would
/// need: the body moves only when its length needs another width. Spans are a few hundred
/// bytes; the request's outer messages are about as long as the last request was.
fn nested_sized(buf: &mut Vec<u8>, field: u32, expected: usize, write: impl FnOnce(&mut Vec<u8>)) {
    tag(buf, field, LEN);
    let length_at = buf.len();
    let reserved = varint_len(expected as u64);
    buf.resize(length_at + reserved, 0);
    write(buf);
    let body_start = length_at + reserved;
    let body_len = buf.len() - body_start;
    let width = varint_len(body_len as u64);
    if width > reserved {
        buf.resize(buf.len() + width - reserved, 0);
        buf.copy_within(body_start..body_start + body_len, length_at + width);
    } else if width < reserved {
        buf.copy_within(body_start..body_start + body_len, length_at + width);
        buf.truncate(length_at + width + body_len);
    }
    let mut length = [0u8; 10];
    let written = varint_into(&mut length, body_len as u64);
    buf[length_at..length_at + written].copy_from_slice(&length[..written]);
}

fn tag(buf: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint(buf, u64::from(field << 3 | wire_type));
}

/// Proto3: an empty string is the default and is not written.
fn string_field(buf: &mut Vec<u8>, field: u32, text: &str) {
    bytes_field(buf, field, text.as_bytes(), false);
}

/// Written when non-empty, or always when `present` (a message field that is set).
fn bytes_field(buf: &mut Vec<u8>, field: u32, bytes: &[u8], present: bool) {
    if present || !bytes.is_empty() {
        tag(buf, field, LEN);
        length_delimited(buf, bytes);
    }
}

fn length_delimited(buf: &mut Vec<u8>, bytes: &[u8]) {
    varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

fn uint_field(buf: &mut Vec<u8>, field: u32, n: u64) {
    if n != 0 {
        tag(buf, field, VARINT);
        varint(buf, n);
    }
}

fn fixed64_field(buf: &mut Vec<u8>, field: u32, n: u64) {
    if n != 0 {
        tag(buf, field, FIXED64);
        buf.extend_from_slice(&n.to_le_bytes());
    }
}

fn fixed32_field(buf: &mut Vec<u8>, field: u32, n: u32) {
    if n != 0 {
        tag(buf, field, FIXED32);
        buf.extend_from_slice(&n.to_le_bytes());
    }
}

fn varint(buf: &mut Vec<u8>, n: u64) {
    // Most are tags and short lengths: one byte.
    if n < 0x80 {
        buf.push(n as u8);
        return;
    }
    let mut bytes = [0u8; 10];
    let written = varint_into(&mut bytes, n);
    buf.extend_from_slice(&bytes[..written]);
}

fn varint_into(out: &mut [u8; 10], mut n: u64) -> usize {
    let mut i = 0;
    while n >= 0x80 {
        out[i] = (n as u8) | 0x80;
        n >>= 7;
        i += 1;
    }
    out[i] = n as u8;
    i + 1
}

fn varint_len(n: u64) -> usize {
    // 7 bits a byte; zero still takes one.
    (64 - (n | 1).leading_zeros() as usize).div_ceil(7)
}

#[cfg(test)]
mod tests {
    use std::{borrow::Cow, time::Duration};

    use opentelemetry::{
        KeyValue,
        trace::{Event, Link, SpanContext, TraceFlags, TraceId, TraceState},
    };
    use opentelemetry_proto::{
        tonic::collector::trace::v1::ExportTraceServiceRequest,
        transform::{
            common::tonic::ResourceAttributesWithSchema,
            trace::tonic::group_spans_by_resource_and_scope,
        },
    };
    use prost::Message;

    use super::*;

    fn span(n: u64, scope: &InstrumentationScope) -> SpanData {
        let mut events = SpanEvents::default();
        let mut links = SpanLinks::default();
        if n % 2 == 1 {
            events.events.push(Event::new(
                "retry",
                UNIX_EPOCH + Duration::from_nanos(1_700_000_000_000_000_000 + n),
                vec![KeyValue::new("attempt", n as i64)],
                1,
            ));
            events.dropped_count = 2;
            links.links.push(Link::new(
                SpanContext::new(
                    TraceId::from(u128::from(n) << 64 | 7),
                    SpanId::from(n + 99),
                    TraceFlags::SAMPLED,
                    true,
                    TraceState::from_key_value([("vendor", "x1")]).unwrap(),
                ),
                vec![KeyValue::new("why", "follows")],
                3,
            ));
            links.dropped_count = 4;
        }
        let long = "é".repeat(200 * n as usize);
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(u128::from(n) * 0x1234_5678_9abc_def0_1111 + 1),
                SpanId::from(n + 1),
                if n.is_multiple_of(3) {
                    TraceFlags::SAMPLED
                } else {
                    TraceFlags::default()
                },
                false,
                if n == 2 {
                    TraceState::from_key_value([("a", "1"), ("b", "2")]).unwrap()
                } else {
                    TraceState::default()
                },
            ),
            parent_span_id: if n.is_multiple_of(2) {
                SpanId::INVALID
            } else {
                SpanId::from(n * 1000)
            },
            parent_span_is_remote: n % 4 == 1,
            span_kind: [
                SpanKind::Internal,
                SpanKind::Server,
                SpanKind::Client,
                SpanKind::Producer,
                SpanKind::Consumer,
            ][n as usize % 5]
                .clone(),
            name: Cow::Owned(format!("execute_tool tool_{n}")),
            start_time: UNIX_EPOCH + Duration::from_nanos(1_700_000_000_000_000_000 + n),
            end_time: UNIX_EPOCH + Duration::from_nanos(1_700_000_000_500_000_000 + n),
            attributes: vec![
                KeyValue::new("gen_ai.tool.name", format!("tool_{n}")),
                KeyValue::new("empty", ""),
                KeyValue::new("long", long),
                KeyValue::new("replay", n.is_multiple_of(2)),
                KeyValue::new("false", false),
                KeyValue::new("count", n as i64),
                KeyValue::new("negative", -(n as i64) - 1),
                KeyValue::new("zero", 0i64),
                KeyValue::new("ratio", n as f64 / 3.0),
                KeyValue::new("zero_f", 0.0),
                KeyValue::new("bools", Value::Array(Array::Bool(vec![true, false]))),
                KeyValue::new("ints", Value::Array(Array::I64(vec![-1, 0, 1 << 40]))),
                KeyValue::new("floats", Value::Array(Array::F64(vec![0.5]))),
                KeyValue::new(
                    "strings",
                    Value::Array(Array::String(vec!["a".into(), "".into()])),
                ),
                KeyValue::new("no_values", Value::Array(Array::String(vec![]))),
            ],
            dropped_attributes_count: (n % 3) as u32,
            events,
            links,
            status: match n % 3 {
                0 => Status::Unset,
                1 => Status::Ok,
                _ => Status::error(format!("refused {n}")),
            },
            instrumentation_scope: scope.clone(),
        }
    }

    fn encoded(spans: &[SpanData], resource: &Resource) -> ExportTraceServiceRequest {
        let mut out = Vec::new();
        export_request(spans, &EncodedResource::new(resource), 0, &mut out);
        let decoded = ExportTraceServiceRequest::decode(out.as_slice()).expect("decodes");
        // A wrong guess of the size changes nothing but where the bytes were first written.
        for expected in [1, 200, 20_000, 3_000_000] {
            let mut guessed = Vec::new();
            export_request(
                spans,
                &EncodedResource::new(resource),
                expected,
                &mut guessed,
            );
            assert_eq!(guessed, out, "expected {expected}");
        }
        decoded
    }

    fn reference(spans: &[SpanData], resource: &Resource) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans.to_vec(),
                &ResourceAttributesWithSchema::from(resource),
            ),
        }
    }

    #[test]
    fn spans_decode_to_what_the_sdk_conversion_makes() {
        let toolgate = InstrumentationScope::builder("toolgate").build();
        let other = InstrumentationScope::builder("other")
            .with_version("1.2")
            .with_schema_url("https://opentelemetry.io/schemas/1.30.0")
            .with_attributes([KeyValue::new("scope.attr", 5i64)])
            .build();
        let resource = Resource::builder_empty()
            .with_service_name("toolgate")
            .with_attributes([
                KeyValue::new("service.version", "0.1.0"),
                KeyValue::new("k8s.pod.name", "agent-0"),
            ])
            .with_schema_url([], "https://opentelemetry.io/schemas/1.29.0")
            .build();
        let spans: Vec<SpanData> = (0..12)
            .map(|n| span(n, if n % 5 == 3 { &other } else { &toolgate }))
            .collect();
        let ours = encoded(&spans, &resource);
        let theirs = reference(&spans, &resource);
        assert_eq!(ours, theirs);
        // The encoding is canonical too: prost writes the same message to the same length.
        let mut out = Vec::new();
        export_request(&spans, &EncodedResource::new(&resource), 0, &mut out);
        assert_eq!(out.len(), theirs.encoded_len());
        assert_eq!(ours.resource_spans[0].scope_spans.len(), 2);
    }

    #[test]
    fn one_span_and_an_empty_resource_decode_the_same() {
        let scope = InstrumentationScope::builder("toolgate").build();
        let resource = Resource::builder_empty().build();
        let spans = vec![span(0, &scope)];
        assert_eq!(encoded(&spans, &resource), reference(&spans, &resource));
    }

    #[test]
    fn lengths_of_every_width_are_written_exactly() {
        for n in [
            0u64,
            1,
            127,
            128,
            16_383,
            16_384,
            2_097_151,
            2_097_152,
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            varint(&mut buf, n);
            assert_eq!(buf.len(), varint_len(n), "{n}");
            assert_eq!(
                prost::encoding::decode_varint(&mut buf.as_slice()).unwrap(),
                n
            );
        }
        for len in [0usize, 127, 128, 20_000, 3_000_000] {
            let mut buf = vec![9u8];
            nested(&mut buf, 1, |b| b.extend(std::iter::repeat_n(7u8, len)));
            let mut rest = &buf[2..];
            assert_eq!(buf[1], 0x0a);
            assert_eq!(
                prost::encoding::decode_varint(&mut rest).unwrap(),
                len as u64
            );
            assert_eq!(rest.len(), len);
            assert!(rest.iter().all(|b| *b == 7));
        }
    }
}
