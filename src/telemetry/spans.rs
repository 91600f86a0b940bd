//! Span conventions, following the OpenTelemetry GenAI semantic conventions for tool execution,
//! and W3C trace-context propagation. Every span toolgate makes is created here, so its names and
//! attributes are in one place (and in docs/observability.md's attribute table).
//!
//! The caller's `traceparent`/`tracestate` is extracted by a tower layer ([`TraceContextLayer`])
//! into the request's extensions; spans take it as their parent, so the agent's trace continues
//! into the sidecar and on to HTTP and MCP backends.

use std::task::{Context as TaskContext, Poll};

use std::{borrow::Cow, sync::Arc};

use opentelemetry::{
    Context, KeyValue, Value,
    propagation::{Extractor, TextMapPropagator},
    trace::{Span as _, SpanBuilder, SpanContext, SpanKind, Status as OtelStatus, TraceContextExt},
};
use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::SdkTracer};

use super::batch::SpanLosses;
use crate::{
    catalog::ToolVersion,
    error::Status,
    identity::{Caller, Door},
    outcome::CallOutcome,
};

/// The caller's trace context, from request metadata.
#[derive(Clone, Debug, Default)]
pub struct RemoteContext(pub Context);

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The W3C header naming the caller's span, made once: looking a header up by `&str` parses and
/// validates the name on every call.
pub static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// Extracts the W3C trace context from headers; empty when malformed.
fn extract(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// The trace context an MCP request carries in its `_meta` (`traceparent`, `tracestate`); empty
/// when malformed.
pub fn extract_from_meta(traceparent: &str, tracestate: Option<&str>) -> Context {
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(traceparent) {
        headers.insert(TRACEPARENT.clone(), value);
    }
    if let Some(value) = tracestate.and_then(|v| http::HeaderValue::from_str(v).ok()) {
        headers.insert(http::HeaderName::from_static("tracestate"), value);
    }
    extract(&headers)
}

/// A tower layer that puts the caller's trace context, when it sent one, into each request's
/// extensions.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceContextLayer;

impl<S> tower::Layer<S> for TraceContextLayer {
    type Service = TraceContextService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TraceContextService { inner }
    }
}

/// See [`TraceContextLayer`].
#[derive(Clone, Debug)]
pub struct TraceContextService<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for TraceContextService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // Most calls carry no trace context, and an absent one reads as empty: only a call that
        // has one pays for the extension (an allocation, and at times the map growing).
        if request.headers().contains_key(&TRACEPARENT) {
            let context = extract(request.headers());
            request.extensions_mut().insert(RemoteContext(context));
        }
        self.inner.call(request)
    }
}

/// Makes toolgate's spans, through the OpenTelemetry SDK directly: each span is built with every
/// attribute known when it starts, and the rest are pushed onto it as the call learns them. (The
/// `tracing-opentelemetry` bridge cost ~20k instructions per call on the workers: every field
/// recorded went through the subscriber and its extensions, and every poll of the call entered
/// and left the span.) Off — no span exists, nothing is paid — when traces are not exported.
#[derive(Clone, Debug, Default)]
pub struct Tracer {
    tracer: Option<SdkTracer>,
    /// What the exporter behind `tracer` lost, for the metrics.
    losses: Arc<SpanLosses>,
}

impl Tracer {
    pub fn new(tracer: SdkTracer, losses: Arc<SpanLosses>) -> Self {
        Tracer {
            tracer: Some(tracer),
            losses,
        }
    }

    /// No spans: traces are not exported.
    pub fn off() -> Self {
        Tracer::default()
    }

    /// Spans made but never exported, by cause; zero when export is off.
    pub fn losses(&self) -> &SpanLosses {
        &self.losses
    }

    /// A span named and described by `describe`, which runs only when spans are made.
    fn start(
        &self,
        kind: SpanKind,
        parent: &Context,
        describe: impl FnOnce() -> (Cow<'static, str>, Vec<KeyValue>),
    ) -> ToolgateSpan {
        ToolgateSpan(self.tracer.as_ref().map(|tracer| {
            let (name, attributes) = describe();
            Box::new(
                SpanBuilder::from_name(name)
                    .with_kind(kind)
                    .with_attributes(attributes)
                    .start_with_context(tracer, parent),
            )
        }))
    }
}

/// One of toolgate's spans. It ends, and goes to the exporter, when dropped. Boxed: a call's
/// future holds its spans across awaits, and an SDK span is ~300 bytes, paid by every call in
/// flight even when traces are off.
#[derive(Debug, Default)]
pub struct ToolgateSpan(Option<Box<opentelemetry_sdk::trace::Span>>);

impl ToolgateSpan {
    /// Whether attributes set on it are kept (it exists and was sampled).
    fn is_recording(&self) -> bool {
        self.0.as_ref().is_some_and(|span| span.is_recording())
    }

    fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new(key, value));
        }
    }

    fn set_status(&mut self, status: OtelStatus) {
        if let Some(span) = &mut self.0 {
            span.set_status(status);
        }
    }

    /// Its span context, when it is traced (sampled or not: the ids are valid either way).
    fn traced_context(&self) -> Option<&SpanContext> {
        self.0
            .as_ref()
            .map(|span| span.span_context())
            .filter(|c| c.is_valid())
    }

    /// The context to parent further spans on: `parent` with this span as its active span, or
    /// `parent` itself when this span does not exist.
    pub fn context(&self, parent: &Context) -> Context {
        match self.traced_context() {
            Some(span_context) => parent.with_remote_span_context(span_context.clone()),
            None => parent.clone(),
        }
    }
}

/// `execute_tool {name}`, kind INTERNAL: one per tool call. It starts with no attributes:
/// [`record_call`] sets them all when the call ends, so a call waiting on its backend holds no
/// attribute list (11 × 56 bytes) and no copies of its names.
pub fn execute_tool(tracer: &Tracer, tool: &str, parent: &Context) -> ToolgateSpan {
    tracer.start(SpanKind::Internal, parent, || {
        (format!("execute_tool {tool}").into(), Vec::new())
    })
}

/// A tool call's id and tool name as its audit event records them (cut to the identifier
/// limit), shared with its span rather than copied.
pub struct CallNames<'a> {
    pub call_id: &'a Arc<str>,
    pub tool: &'a Arc<str>,
}

/// The tool call's attributes and status, when it has ended: who called, what the chain
/// resolved (`tool`, when it did), and the outcome.
pub fn record_call(
    span: &mut ToolgateSpan,
    caller: &Caller,
    door: Door,
    names: CallNames<'_>,
    tool: Option<&ToolVersion>,
    outcome: &CallOutcome,
) {
    if !span.is_recording() {
        return;
    }
    span.set("gen_ai.operation.name", "execute_tool");
    span.set("gen_ai.tool.name", names.tool.clone());
    span.set("gen_ai.tool.call.id", names.call_id.clone());
    span.set("toolgate.tenant", caller.tenant.clone());
    span.set("toolgate.agent", caller.agent.clone());
    span.set("toolgate.door", door.as_str());
    if let Some(tool) = tool {
        span.set("toolgate.tool.version", tool.version.clone());
        span.set("toolgate.risk_level", tool.risk_level.as_str());
        span.set("toolgate.executor", tool.executor.kind());
        span.set("gen_ai.tool.type", gen_ai_tool_type(tool));
    }
    span.set("toolgate.status", outcome.status.as_str());
    span.set("toolgate.idempotent_replay", outcome.idempotent_replay);
    match &outcome.refusal {
        None => span.set_status(OtelStatus::Ok),
        Some(refusal) => {
            let reason = refusal.text_for_record().into_owned();
            span.set("error.type", refusal.reason.code());
            span.set("toolgate.refused_by", refusal.stage.as_str());
            span.set("toolgate.reason", reason.clone());
            span.set_status(OtelStatus::error(reason));
        }
    }
}

/// The GenAI convention's tool types: code run where the agent runs ("function"), or a service
/// reached over the network ("extension").
fn gen_ai_tool_type(tool: &ToolVersion) -> &'static str {
    match tool.executor.kind() {
        "http" | "mcp" => "extension",
        _ => "function",
    }
}

/// Arguments and result are recorded only for tools that opt in (`trace_content: true`).
pub fn record_content(
    span: &mut ToolgateSpan,
    arguments: &serde_json::Value,
    outcome: &CallOutcome,
) {
    if !span.is_recording() {
        return;
    }
    span.set("gen_ai.tool.call.arguments", arguments.to_string());
    if outcome.status == Status::Ok {
        span.set("gen_ai.tool.call.result", outcome.model_text.clone());
    }
}

/// `{executor} {tool}`, kind CLIENT: the backend call, child of the tool call's span (whose own
/// parent is `parent`). Builtins run inside the tool call's own span: a second span would double
/// what is exported and say nothing.
pub fn backend_call(
    tracer: &Tracer,
    tool: &ToolVersion,
    call: &ToolgateSpan,
    parent: &Context,
) -> ToolgateSpan {
    if !tool.executor.leaves_process() || call.0.is_none() {
        return ToolgateSpan::default();
    }
    tracer.start(SpanKind::Client, &call.context(parent), || {
        (
            format!("{} {}", tool.executor.kind(), tool.name).into(),
            vec![
                KeyValue::new("toolgate.executor", tool.executor.kind()),
                KeyValue::new("gen_ai.tool.name", tool.name.clone()),
            ],
        )
    })
}

/// `list_tools`, kind SERVER.
pub fn list_tools(tracer: &Tracer, tenant: &str, parent: &Context) -> ToolgateSpan {
    tracer.start(SpanKind::Server, parent, || {
        (
            "list_tools".into(),
            vec![KeyValue::new("toolgate.tenant", tenant.to_owned())],
        )
    })
}

/// What ListTools answered: how many tools, at which catalog revision.
pub fn record_listed(span: &mut ToolgateSpan, tools: usize, catalog_revision: &str) {
    if !span.is_recording() {
        return;
    }
    span.set("toolgate.tools", i64::try_from(tools).unwrap_or(i64::MAX));
    span.set("toolgate.catalog_revision", catalog_revision.to_owned());
}

/// `execute_tools`, kind SERVER: the parent of one model turn's calls.
pub fn execute_tools(
    tracer: &Tracer,
    tenant: &str,
    calls: usize,
    parallel: bool,
    parent: &Context,
) -> ToolgateSpan {
    tracer.start(SpanKind::Server, parent, || {
        (
            "execute_tools".into(),
            vec![
                KeyValue::new("toolgate.tenant", tenant.to_owned()),
                KeyValue::new("toolgate.calls", i64::try_from(calls).unwrap_or(i64::MAX)),
                KeyValue::new("toolgate.parallel", parallel),
            ],
        )
    })
}

/// The W3C `traceparent` for an outbound request made within `span`, when it is traced.
pub fn traceparent(span: &ToolgateSpan) -> Option<String> {
    span.traced_context().map(format_traceparent)
}

/// The caller's `traceparent`, when it sent a valid W3C trace context: read from `remote`, the
/// context [`TraceContextLayer`] extracted from its metadata, so a request's header is parsed
/// once, and written only for a call that goes to a backend. Anything else is dropped rather
/// than passed on to backends. Normalized (version 00, lowercase).
fn caller_traceparent(remote: &Context) -> Option<String> {
    let span = remote.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| format_traceparent(span_context))
}

/// The `traceparent` a backend call made within `span` sends: the span's own when it is traced,
/// else the caller's from `parent` (already validated; with spans off, the turn's context is
/// the caller's), else a fresh one, so every upstream request can be correlated. Builtins run
/// in the sidecar and get none.
pub fn outbound_traceparent(
    span: &ToolgateSpan,
    tool: &ToolVersion,
    parent: &Context,
) -> Option<String> {
    if !tool.executor.leaves_process() {
        return None;
    }
    traceparent(span)
        .or_else(|| caller_traceparent(parent))
        .or_else(|| {
            use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
            let ids = RandomIdGenerator::default();
            // Sampled: no sampler upstream of the sidecar decided otherwise.
            Some(format!(
                "00-{}-{}-01",
                ids.new_trace_id(),
                ids.new_span_id()
            ))
        })
}

fn format_traceparent(c: &opentelemetry::trace::SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        c.trace_id(),
        c.span_id(),
        c.trace_flags().to_u8()
    )
}

/// Trace and span ids for the audit event, when the span is traced. As bytes: a `TraceId` is a
/// `u128`, whose 16-byte alignment would pad the call's future that keeps them.
pub fn ids(span: &ToolgateSpan) -> Option<([u8; 16], [u8; 8])> {
    span.traced_context()
        .map(|c| (c.trace_id().to_bytes(), c.span_id().to_bytes()))
}
