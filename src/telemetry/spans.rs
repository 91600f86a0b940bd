//! Span conventions, following the OpenTelemetry GenAI semantic conventions for tool execution,
//! and W3C trace-context propagation. Every span toolgate makes is created here, so its names and
//! attributes are in one place (and in the README's attribute table).
//!
//! The caller's `traceparent`/`tracestate` is extracted by a tower layer ([`TraceContextLayer`])
//! into the request's extensions; spans take it as their parent, so the agent's trace continues
//! into the sidecar and on to HTTP and MCP backends.

use std::task::{Context as TaskContext, Poll};

use opentelemetry::{
    Context,
    propagation::{Extractor, TextMapPropagator},
    trace::TraceContextExt,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::{Span, field::Empty};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{boundary::CallOutcome, canonical::lower_hex, catalog::ToolVersion, error::Status};

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

/// Extracts the W3C trace context from headers; empty when absent or malformed.
pub fn extract(headers: &http::HeaderMap) -> Context {
    // Most calls carry no trace context: skip the propagator's work for them.
    if !headers.contains_key("traceparent") {
        return Context::new();
    }
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// A tower layer that puts the caller's trace context into each request's extensions.
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
        let context = extract(request.headers());
        request.extensions_mut().insert(RemoteContext(context));
        self.inner.call(request)
    }
}

/// `execute_tool {name}`, kind INTERNAL: one per tool call.
pub fn execute_tool(
    tool: &str,
    call_id: &str,
    tenant: &str,
    agent: &str,
    parent: &Context,
) -> Span {
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = %format!("execute_tool {tool}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.type = Empty,
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        error.type = Empty,
        toolgate.tenant = %tenant,
        toolgate.agent = %agent,
        toolgate.tool.version = Empty,
        toolgate.risk_level = Empty,
        toolgate.executor = Empty,
        toolgate.status = Empty,
        toolgate.refused_by = Empty,
        toolgate.reason = Empty,
        toolgate.idempotent_replay = Empty,
    );
    let _ = span.set_parent(parent.clone());
    span
}

/// What the chain learned about the tool, once it resolved.
pub fn record_tool(span: &Span, tool: &ToolVersion) {
    span.record("toolgate.tool.version", tool.version.as_str());
    span.record("toolgate.risk_level", tool.risk_level.as_str());
    span.record("toolgate.executor", tool.executor.kind());
    span.record("gen_ai.tool.type", gen_ai_tool_type(tool));
}

/// The GenAI convention's tool types: code run where the agent runs ("function"), or a service
/// reached over the network ("extension").
fn gen_ai_tool_type(tool: &ToolVersion) -> &'static str {
    match tool.executor.kind() {
        "http" | "mcp" => "extension",
        _ => "function",
    }
}

/// The call's outcome; span status ERROR for anything but OK.
pub fn record_outcome(span: &Span, outcome: &CallOutcome) {
    span.record("toolgate.status", outcome.status.as_str());
    span.record("toolgate.idempotent_replay", outcome.idempotent_replay);
    match &outcome.refusal {
        None => {
            span.record("otel.status_code", "OK");
        }
        Some(refusal) => {
            span.record("otel.status_code", "ERROR");
            let reason = refusal.text_for_record();
            span.record("otel.status_description", reason.as_ref());
            span.record("error.type", refusal.reason.code());
            span.record("toolgate.refused_by", refusal.stage.as_str());
            span.record("toolgate.reason", reason.as_ref());
        }
    }
}

/// Arguments and result are recorded only for tools that opt in (`trace_content: true`).
pub fn record_content(span: &Span, arguments: &str, outcome: &CallOutcome) {
    span.record("gen_ai.tool.call.arguments", arguments);
    if outcome.status == Status::Ok {
        span.record("gen_ai.tool.call.result", outcome.model_text.as_str());
    }
}

/// `{executor} {tool}`, kind CLIENT: the backend call, child of the tool call. Builtins run
/// inside the tool call's own span: a second span would double what is exported and say nothing.
pub fn backend_call(tool: &ToolVersion) -> Span {
    if !tool.executor.leaves_process() {
        return Span::none();
    }
    tracing::info_span!(
        "backend_call",
        otel.name = %format!("{} {}", tool.executor.kind(), tool.name),
        otel.kind = "client",
        toolgate.executor = tool.executor.kind(),
        gen_ai.tool.name = %tool.name,
    )
}

/// `list_tools`, kind SERVER.
pub fn list_tools(tenant: &str, parent: &Context) -> Span {
    let span = tracing::info_span!(
        "list_tools",
        otel.name = "list_tools",
        otel.kind = "server",
        toolgate.tenant = %tenant,
        toolgate.tools = Empty,
        toolgate.catalog_revision = Empty,
    );
    let _ = span.set_parent(parent.clone());
    span
}

/// `execute_tools`, kind SERVER: the parent of one model turn's calls.
pub fn execute_tools(tenant: &str, calls: usize, parallel: bool, parent: &Context) -> Span {
    let span = tracing::info_span!(
        "execute_tools",
        otel.name = "execute_tools",
        otel.kind = "server",
        toolgate.tenant = %tenant,
        toolgate.calls = calls,
        toolgate.parallel = parallel,
    );
    let _ = span.set_parent(parent.clone());
    span
}

/// The span's OpenTelemetry context, to parent further spans on.
pub fn context_of(span: &Span) -> Context {
    span.context()
}

/// The span's OpenTelemetry span context, when it is traced.
fn traced_context(span: &Span) -> Option<opentelemetry::trace::SpanContext> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

/// The W3C `traceparent` for an outbound request made within `span`, when it is traced.
pub fn traceparent(span: &Span) -> Option<String> {
    traced_context(span).map(|c| format_traceparent(&c))
}

/// The caller's `traceparent` metadata, when it is a valid W3C trace context; anything else is
/// dropped rather than passed on to backends. Normalized (version 00, lowercase).
pub fn caller_traceparent(value: Option<&str>) -> Option<String> {
    let carrier = std::collections::HashMap::from([("traceparent".to_owned(), value?.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| format_traceparent(&span_context))
}

/// The `traceparent` a backend call made within `span` sends: the span's own when it is traced,
/// else the caller's (already validated), else a fresh one, so every upstream request can be
/// correlated. Builtins run in the sidecar and get none.
pub fn outbound_traceparent(
    span: &Span,
    tool: &ToolVersion,
    caller: Option<&str>,
) -> Option<String> {
    if !tool.executor.leaves_process() {
        return None;
    }
    traceparent(span)
        .or_else(|| caller.map(str::to_owned))
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

/// Trace and span ids (hex) for the audit event, when the span is traced.
pub fn ids(span: &Span) -> Option<(String, String)> {
    traced_context(span).map(|c| {
        (
            lower_hex(&c.trace_id().to_bytes()),
            lower_hex(&c.span_id().to_bytes()),
        )
    })
}
