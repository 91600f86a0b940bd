//! Spans, following the OpenTelemetry GenAI semantic conventions for tool execution, and W3C
//! trace-context propagation. Every span toolgate makes is started here; what a tool call's
//! span says of the call (its attributes and status) is the boundary's (`boundary/tool_spans.rs`).
//! Both are listed in docs/observability.md's attribute table.
//!
//! The caller's `traceparent`/`tracestate` is extracted by a tower layer ([`TraceContextLayer`])
//! into the request's extensions; spans take it as their parent, so the agent's trace continues
//! into the sidecar and on to HTTP and MCP backends.

use std::task::{Context as TaskContext, Poll};

use std::{borrow::Cow, sync::Arc};

use opentelemetry::{
    Context, InstrumentationScope, KeyValue, Value,
    propagation::{Extractor, TextMapPropagator},
    trace::{SpanContext, SpanId, SpanKind, Status as OtelStatus, TraceContextExt, TraceFlags},
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{
        IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample, SpanData,
        SpanEvents, SpanLinks, SpanProcessor as _,
    },
};

use super::batch::{BatchExport, SpanLosses};

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

/// Makes toolgate's spans: samples them as the configured sampler says, gives them ids, and
/// hands each, when it ends, to the export queue. Not through the SDK's `Tracer`: an SDK span
/// is ~300 bytes, kept by every call in flight for as long as it waits, and making one costs a
/// `SpanBuilder`, the provider's checks and a `SpanData` filled as it starts. A span here holds
/// only what the call has learnt until it ends (its ids, parent, start time and name), and its
/// `SpanData` is made once, when it is sent. (The `tracing-opentelemetry` bridge before it cost
/// ~20k instructions per call on the workers.) Off — no span exists, nothing is paid — when
/// traces are not exported.
#[derive(Clone, Debug, Default)]
pub struct Tracer {
    export: Option<Arc<Export>>,
    /// What the export queue lost, for the metrics.
    losses: Arc<SpanLosses>,
}

/// Where spans go and how they are chosen, shared by every span of one tracer.
#[derive(Debug)]
struct Export {
    sampler: Sampler,
    ids: RandomIdGenerator,
    scope: InstrumentationScope,
    queue: Arc<BatchExport>,
}

impl Tracer {
    /// Spans sampled by `sampler`, sent to `queue` as they end.
    pub fn new(sampler: Sampler, queue: Arc<BatchExport>) -> Self {
        Tracer {
            losses: queue.losses(),
            export: Some(Arc::new(Export {
                sampler,
                ids: RandomIdGenerator::default(),
                scope: InstrumentationScope::builder("toolgate").build(),
                queue,
            })),
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

    /// A span named and described by `describe`, which runs only when spans are made; the child
    /// of `parent`'s span when it has a valid one. Sampled as the SDK's
    /// tracer samples: the sampler sees the parent, the trace id, the kind and the attributes;
    /// a span it drops still has ids (a backend is sent its `traceparent`) but records nothing.
    fn start(
        &self,
        kind: SpanKind,
        parent: &Context,
        describe: impl FnOnce() -> (SpanName, Vec<KeyValue>),
    ) -> ToolgateSpan {
        let Some(export) = &self.export else {
            return ToolgateSpan::default();
        };
        let parent_span = parent.span();
        let parent_context = Some(parent_span.span_context()).filter(|c| c.is_valid());
        let trace_id = match parent_context {
            Some(parent) => parent.trace_id(),
            None => export.ids.new_trace_id(),
        };
        let (name, mut attributes) = describe();
        let sampling = export.sampler.should_sample(
            Some(parent),
            trace_id,
            name.for_sampler(),
            &kind,
            &attributes,
            &[],
        );
        let parent_flags = parent_context.map_or(TraceFlags::default(), |c| c.trace_flags());
        let (flags, recording) = match sampling.decision {
            SamplingDecision::RecordAndSample => (parent_flags.with_sampled(true), true),
            SamplingDecision::RecordOnly => (parent_flags.with_sampled(false), true),
            SamplingDecision::Drop => (TraceFlags::default(), false),
        };
        let span_id = export.ids.new_span_id();
        let context = SpanContext::new(trace_id, span_id, flags, false, sampling.trace_state);
        attributes.extend(sampling.attributes);
        ToolgateSpan(Some(Box::new(OpenSpan {
            context,
            parent_span_id: parent_context.map_or(SpanId::INVALID, |c| c.span_id()),
            parent_is_remote: parent_context.is_some_and(|c| c.is_remote()),
            kind,
            recording,
            name,
            start_time: opentelemetry::time::now(),
            attributes,
            status: OtelStatus::Unset,
            export: export.clone(),
        })))
    }
}

/// A span's name. The tool call's is formatted when the span is sent, so a call waiting on its
/// backend holds the tool's name (shared) rather than a string of its own.
#[derive(Debug)]
enum SpanName {
    Fixed(Cow<'static, str>),
    /// `execute_tool {tool}`.
    ExecuteTool(Arc<str>),
}

impl SpanName {
    /// What the sampler is shown as the name. The tool call's prefix alone: the samplers
    /// toolgate configures (always, ratio, parent-based) do not read names.
    fn for_sampler(&self) -> &str {
        match self {
            SpanName::Fixed(name) => name,
            SpanName::ExecuteTool(_) => "execute_tool",
        }
    }

    fn into_cow(self) -> Cow<'static, str> {
        match self {
            SpanName::Fixed(name) => name,
            SpanName::ExecuteTool(tool) => {
                // Joined rather than `format!`ted: this runs once per call.
                const PREFIX: &str = "execute_tool ";
                let mut name = String::with_capacity(PREFIX.len() + tool.len());
                name.push_str(PREFIX);
                name.push_str(&tool);
                name.into()
            }
        }
    }
}

/// A span that has started and not ended.
#[derive(Debug)]
struct OpenSpan {
    context: SpanContext,
    parent_span_id: SpanId,
    parent_is_remote: bool,
    kind: SpanKind,
    /// Whether it keeps attributes and goes to the export queue (the sampler said so).
    recording: bool,
    name: SpanName,
    start_time: std::time::SystemTime,
    /// The fixed set this file sets, so under any span limit.
    attributes: Vec<KeyValue>,
    status: OtelStatus,
    export: Arc<Export>,
}

impl OpenSpan {
    /// Ends it now and queues it for export (the queue keeps only sampled spans).
    fn end(self) {
        if !self.recording {
            return;
        }
        let export = self.export;
        export.queue.on_end(SpanData {
            span_context: self.context,
            parent_span_id: self.parent_span_id,
            parent_span_is_remote: self.parent_is_remote,
            span_kind: self.kind,
            name: self.name.into_cow(),
            start_time: self.start_time,
            end_time: opentelemetry::time::now(),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: self.status,
            instrumentation_scope: export.scope.clone(),
        });
    }
}

/// One of toolgate's spans. It ends, and goes to the exporter, when dropped. Boxed: a call's
/// future holds its spans across awaits, and every call in flight would pay for the span's
/// ~170 bytes even when traces are off.
#[derive(Debug, Default)]
pub struct ToolgateSpan(Option<Box<OpenSpan>>);

impl Drop for ToolgateSpan {
    fn drop(&mut self) {
        if let Some(span) = self.0.take() {
            span.end();
        }
    }
}

impl ToolgateSpan {
    /// Whether attributes set on it are kept (it exists and was sampled).
    pub fn is_recording(&self) -> bool {
        self.0.as_ref().is_some_and(|span| span.recording)
    }

    /// Sets attribute `key`, when it records.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(span) = self.0.as_mut().filter(|span| span.recording) {
            span.attributes.push(KeyValue::new(key, value));
        }
    }

    /// Sets its status, when it records.
    pub fn set_status(&mut self, status: OtelStatus) {
        if let Some(span) = self.0.as_mut().filter(|span| span.recording) {
            span.status = status;
        }
    }

    /// Its span context, when it is traced (sampled or not: the ids are valid either way).
    fn traced_context(&self) -> Option<&SpanContext> {
        self.0
            .as_ref()
            .map(|span| &span.context)
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
pub fn execute_tool(tracer: &Tracer, tool: &Arc<str>, parent: &Context) -> ToolgateSpan {
    tracer.start(SpanKind::Internal, parent, || {
        (SpanName::ExecuteTool(tool.clone()), Vec::new())
    })
}

/// `{executor} {tool}`, kind CLIENT: the backend call, child of the tool call's span (whose own
/// parent is `parent`), for a backend that `leaves_process`. Builtins run inside the tool call's
/// own span: a second span would double what is exported and say nothing.
pub fn backend_call(
    tracer: &Tracer,
    executor: &'static str,
    tool: &str,
    leaves_process: bool,
    call: &ToolgateSpan,
    parent: &Context,
) -> ToolgateSpan {
    if !leaves_process || call.0.is_none() {
        return ToolgateSpan::default();
    }
    tracer.start(SpanKind::Client, &call.context(parent), || {
        (
            SpanName::Fixed(format!("{executor} {tool}").into()),
            vec![
                KeyValue::new("toolgate.executor", executor),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
            ],
        )
    })
}

/// `list_tools`, kind SERVER.
pub fn list_tools(tracer: &Tracer, tenant: &str, parent: &Context) -> ToolgateSpan {
    tracer.start(SpanKind::Server, parent, || {
        (
            SpanName::Fixed("list_tools".into()),
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
            SpanName::Fixed("execute_tools".into()),
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
    leaves_process: bool,
    parent: &Context,
) -> Option<String> {
    if !leaves_process {
        return None;
    }
    traceparent(span)
        .or_else(|| caller_traceparent(parent))
        .or_else(|| {
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::{Span as _, SpanBuilder, TraceId, TraceState, TracerProvider as _};
    use opentelemetry_sdk::{
        error::OTelSdkResult,
        trace::{SdkTracerProvider, SpanExporter},
    };

    use super::*;
    use crate::telemetry::batch::BatchSettings;

    /// Keeps what it is sent.
    #[derive(Debug, Default, Clone)]
    struct Kept(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Kept {
        fn export(
            &self,
            batch: Vec<SpanData>,
        ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
            self.0.lock().unwrap().extend(batch);
            std::future::ready(Ok(()))
        }
    }

    fn tracer(sampler: Sampler) -> (Tracer, Arc<BatchExport>, Kept) {
        let kept = Kept::default();
        let queue = BatchExport::start(
            kept.clone(),
            BatchSettings {
                delay: std::time::Duration::from_secs(3600),
                max_queue_size: 64,
                max_export_batch_size: 64,
            },
        )
        .unwrap();
        let queue = Arc::new(queue);
        (Tracer::new(sampler, queue.clone()), queue, kept)
    }

    fn remote_parent(sampled: bool) -> Context {
        let flags = match sampled {
            true => TraceFlags::SAMPLED,
            false => TraceFlags::default(),
        };
        let state = TraceState::from_key_value([("vendor", "v1")]).unwrap();
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from(0x0af7651916cd43dd8448eb211c80319c_u128),
            SpanId::from(0xb7ad6b7169203331_u64),
            flags,
            true,
            state,
        ))
    }

    #[test]
    fn spans_are_sampled_and_parented_as_the_sdk_tracer_would_make_them() {
        let ratio = |r| Sampler::TraceIdRatioBased(r);
        let parent_based = |s| Sampler::ParentBased(Box::new(s));
        // With whether a root span's sampling depends on its (random) trace id.
        let samplers = [
            (Sampler::AlwaysOn, false),
            (Sampler::AlwaysOff, false),
            (ratio(0.0), false),
            (ratio(0.5), true),
            (ratio(1.0), false),
            (parent_based(Sampler::AlwaysOn), false),
            (parent_based(Sampler::AlwaysOff), false),
            (parent_based(ratio(0.5)), true),
        ];
        let parents = [
            ("no parent", Context::new()),
            ("sampled parent", remote_parent(true)),
            ("unsampled parent", remote_parent(false)),
        ];
        for (sampler, random_at_root) in samplers {
            let sdk = SdkTracerProvider::builder()
                .with_sampler(sampler.clone())
                .build()
                .tracer("toolgate");
            let (ours, queue, _) = tracer(sampler.clone());
            for (which, parent) in &parents {
                let theirs =
                    SpanBuilder::from_name("execute_tool echo").start_with_context(&sdk, parent);
                let mine = execute_tool(&ours, &Arc::from("echo"), parent);
                let (expected, got) = (theirs.span_context(), mine.traced_context().unwrap());
                let case = format!("{sampler:?} with {which}");
                assert!(got.is_valid() && !got.is_remote(), "{case}");
                assert_eq!(got.trace_state(), expected.trace_state(), "{case}");
                if parent.has_active_span() {
                    assert_eq!(got.trace_id(), expected.trace_id(), "{case}");
                } else if random_at_root {
                    continue;
                }
                assert_eq!(mine.is_recording(), theirs.is_recording(), "{case}");
                assert_eq!(got.trace_flags(), expected.trace_flags(), "{case}");
            }
            queue
                .shutdown_with_timeout(std::time::Duration::from_secs(5))
                .unwrap();
        }
    }

    #[test]
    fn an_ended_span_is_exported_with_its_parent_name_attributes_and_status() {
        let (tracer, queue, kept) = tracer(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let parent = remote_parent(true);
        let before = opentelemetry::time::now();
        let mut call = execute_tool(&tracer, &Arc::from("echo"), &parent);
        call.set("toolgate.tenant", "acme");
        call.set_status(OtelStatus::Ok);
        let call_context = call.traced_context().unwrap().clone();
        let backend_parent = call.context(&parent);
        let child = tracer.start(SpanKind::Client, &backend_parent, || {
            (
                SpanName::Fixed("http echo".into()),
                vec![KeyValue::new("k", 1)],
            )
        });
        let child_context = child.traced_context().unwrap().clone();
        drop(child);
        drop(call);
        queue.force_flush().unwrap();
        let spans = kept.0.lock().unwrap();
        let [child, call] = &spans[..] else {
            panic!("two spans, child first: {spans:#?}")
        };
        assert_eq!(call.name, "execute_tool echo");
        assert_eq!(call.span_kind, SpanKind::Internal);
        assert_eq!(call.span_context, call_context);
        assert_eq!(call.parent_span_id, SpanId::from(0xb7ad6b7169203331_u64));
        assert!(call.parent_span_is_remote);
        assert_eq!(
            call.attributes,
            vec![KeyValue::new("toolgate.tenant", "acme")]
        );
        assert_eq!(call.status, OtelStatus::Ok);
        assert!(before <= call.start_time && call.start_time <= call.end_time);
        assert_eq!(call.instrumentation_scope.name(), "toolgate");
        assert_eq!(child.name, "http echo");
        assert_eq!(child.span_context, child_context);
        assert_eq!(child.span_context.trace_id(), call_context.trace_id());
        assert_eq!(child.parent_span_id, call_context.span_id());
        assert_eq!(child.attributes, vec![KeyValue::new("k", 1)]);
        assert_eq!(child.status, OtelStatus::Unset);
    }

    #[test]
    fn a_span_the_sampler_drops_has_ids_but_records_and_exports_nothing() {
        let (tracer, queue, kept) = tracer(Sampler::AlwaysOff);
        let mut span = execute_tool(&tracer, &Arc::from("echo"), &Context::new());
        span.set("toolgate.tenant", "acme");
        assert!(!span.is_recording());
        let context = span.traced_context().unwrap();
        assert!(context.is_valid() && !context.is_sampled());
        assert!(traceparent(&span).unwrap().ends_with("-00"));
        drop(span);
        queue.force_flush().unwrap();
        assert!(kept.0.lock().unwrap().is_empty());
    }

    /// What a call waiting on its backend holds for its span, besides the box's pointer (the
    /// SDK's span was ~300 bytes, and its name a string of its own).
    #[test]
    fn a_waiting_calls_span_holds_under_200_bytes() {
        assert!(
            std::mem::size_of::<OpenSpan>() <= 192,
            "{}",
            std::mem::size_of::<OpenSpan>()
        );
    }
}
