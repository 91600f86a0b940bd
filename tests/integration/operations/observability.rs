//! Traces (to a real in-process OTLP collector, from the real binary configured by the standard
//! OTEL_* variables) and Prometheus metrics. The audit log's guarantees under a slow, stuck or
//! failing sink are in `audit_under_pressure.rs`.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, http::HeaderMap, routing::post};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest, trace::v1::Span,
};
use prost::Message;
use toolgate::proto::{self, ToolStatus};

use crate::{
    otlp_collector::{self, string_attribute},
    support::binary::{Spawned, client, spawn_with_env},
    support::{STAGES, TestServer, call, exec, execute_request, who},
};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    string_attribute(&span.attributes, key)
}

/// An upstream that records the traceparent it was sent.
async fn traced_upstream() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = Router::new().route(
        "/lookup",
        post(move |headers: HeaderMap, _body: Bytes| {
            let record = record.clone();
            async move {
                if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
                    record.lock().unwrap().push(tp.to_owned());
                }
                "{\"found\":true}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn traced_catalog(upstream: std::net::SocketAddr, batch_delay: &str) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
telemetry: {{ batch_delay: {batch_delay} }}
tenants: {{ acme: {{}} }}
upstreams:
  svc: {{ url: "http://{upstream}", allow_schemes: [http], allow_private_addresses: true }}
tools:
  - {{ name: lookup, description: Looks up., risk_level: read_only, executor: {{ http: {{ upstream: svc, path: /lookup }} }}, input_schema: {{ type: object }} }}
  - {{ name: echo, description: Echoes., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object, properties: {{ text: {{ type: string }} }}, required: [text] }} }}
  - name: card
    description: Records its arguments, redacted.
    risk_level: read_only
    record_arguments: true
    redact: ["/card/number"]
    executor: {{ builtin: echo_arguments }}
    input_schema: {{ type: object }}
"#
    )
}

/// The sidecar serving [`traced_catalog`] with `env`; the directory holds its catalog for as
/// long as it runs.
fn spawn_traced(
    upstream: std::net::SocketAddr,
    batch_delay: &str,
    env: &[(&str, &str)],
) -> (tempfile::TempDir, Spawned) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, traced_catalog(upstream, batch_delay)).unwrap();
    let spawned = spawn_with_env(&["--config", config.to_str().unwrap()], env);
    (dir, spawned)
}

/// A request from acme's agent, sent within the caller's span.
fn traced<T>(body: T) -> tonic::Request<T> {
    let mut request = who("acme").request(body);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    request
}

#[tokio::test]
async fn spans_follow_the_caller_into_the_sidecar_and_on_to_the_upstream() {
    let collector = otlp_collector::start().await;
    let (upstream, seen) = traced_upstream().await;
    let endpoint = collector.endpoint();
    let (_dir, spawned) = spawn_traced(
        upstream,
        "50ms",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "toolgate-test"),
        ],
    );
    let mut client = client(&spawned.addr).await;
    let ok = client
        .execute_tool(traced(execute_request(call("lookup", "{}"))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(ok.status(), ToolStatus::Ok, "{ok:?}");
    let refused = client
        .execute_tool(traced(execute_request(call("echo", "{}"))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(refused.status(), ToolStatus::InvalidArguments);
    let batch = proto::ExecuteToolsRequest {
        calls: vec![
            call("echo", r#"{"text":"a"}"#),
            call("echo", r#"{"text":"b"}"#),
        ],
        run_id: "run-1".into(),
        step: 1,
        parallel: true,
        max_parallel: 0,
        catalog_revision: String::new(),
    };
    client.execute_tools(traced(batch)).await.unwrap();
    client
        .list_tools(traced(proto::ListToolsRequest {}))
        .await
        .unwrap();
    let secret = client
        .execute_tool(traced(execute_request(call(
            "card",
            r#"{"card":{"number":"4111111111111111","name":"Ada"}}"#,
        ))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(secret.status(), ToolStatus::Ok);

    let spans = collector
        .wait_for_spans(
            |s| {
                s.iter()
                    .filter(|s| s.name.starts_with("execute_tool "))
                    .count()
                    >= 5
                    && s.iter().any(|s| s.name == "list_tools")
            },
            Duration::from_secs(20),
        )
        .await;
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    let by_name =
        |name: &str| -> Vec<&Span> { ours.iter().copied().filter(|s| s.name == name).collect() };

    // The tool call: INTERNAL, child of the caller's span, with the GenAI attributes.
    let lookup = by_name("execute_tool lookup");
    assert_eq!(
        lookup.len(),
        1,
        "{:?}",
        ours.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let lookup = lookup[0];
    assert_eq!(lookup.kind, 1, "INTERNAL");
    assert_eq!(hex(&lookup.parent_span_id), CALLER_SPAN);
    for (key, value) in [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "lookup"),
        ("gen_ai.tool.call.id", ok.call_id.as_str()),
        ("gen_ai.tool.type", "extension"),
        ("toolgate.tenant", "acme"),
        ("toolgate.door", "grpc"),
        ("toolgate.tool.version", "1"),
        ("toolgate.risk_level", "READ_ONLY"),
        ("toolgate.status", "OK"),
    ] {
        assert_eq!(attribute(lookup, key).as_deref(), Some(value), "{key}");
    }
    assert!(
        attribute(lookup, "gen_ai.tool.call.arguments").is_none(),
        "arguments are not recorded unless a tool opts in"
    );
    // Exactly the attributes docs/observability.md lists for a call that succeeded: nothing about
    // the sidecar's insides (code location, threads, busy/idle time, the Rust module).
    let mut keys: Vec<&str> = lookup.attributes.iter().map(|a| a.key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "gen_ai.operation.name",
            "gen_ai.tool.call.id",
            "gen_ai.tool.name",
            "gen_ai.tool.type",
            "toolgate.agent",
            "toolgate.door",
            "toolgate.executor",
            "toolgate.idempotent_replay",
            "toolgate.risk_level",
            "toolgate.status",
            "toolgate.tenant",
            "toolgate.tool.version",
        ]
    );
    assert_eq!(lookup.status.as_ref().map(|s| s.code), Some(1), "OK");
    // Builtins run inside their tool call's span; no CLIENT span of their own.
    assert!(!by_name("execute_tool echo").is_empty());
    assert!(
        ours.iter().all(|s| !s.name.starts_with("builtin ")),
        "{:?}",
        ours.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    // The backend call: CLIENT, child of the tool call; the upstream got its context.
    let backend = by_name("http lookup");
    assert_eq!(backend.len(), 1);
    assert_eq!(backend[0].kind, 3, "CLIENT");
    assert_eq!(backend[0].parent_span_id, lookup.span_id);
    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0],
        format!("00-{TRACE_ID}-{}-01", hex(&backend[0].span_id))
    );

    // A refusal: status ERROR, with the stage and error type.
    let echo_refused = ours
        .iter()
        .find(|s| s.name == "execute_tool echo" && attribute(s, "toolgate.refused_by").is_some())
        .expect("the refused call's span");
    assert_eq!(
        echo_refused.status.as_ref().map(|s| s.code),
        Some(2),
        "ERROR"
    );
    assert_eq!(
        attribute(echo_refused, "error.type").as_deref(),
        Some("schema_violation")
    );
    assert_eq!(
        attribute(echo_refused, "toolgate.refused_by").as_deref(),
        Some("schema")
    );

    // ExecuteTools: a SERVER span under the caller, parent of both calls.
    let turn = by_name("execute_tools");
    assert_eq!(turn.len(), 1);
    assert_eq!(
        (turn[0].kind, hex(&turn[0].parent_span_id)),
        (2, CALLER_SPAN.to_owned())
    );
    let children = ours
        .iter()
        .filter(|s| s.name == "execute_tool echo" && s.parent_span_id == turn[0].span_id)
        .count();
    assert_eq!(children, 2);
    assert_eq!(by_name("list_tools").len(), 1);

    // Opt-in content, redacted.
    let card = by_name("execute_tool card")[0];
    let arguments = attribute(card, "gen_ai.tool.call.arguments").expect("recorded for this tool");
    assert!(
        arguments.contains("[redacted]")
            && !arguments.contains("4111")
            && arguments.contains("Ada"),
        "{arguments}"
    );

    // Resource: the service name from OTEL_SERVICE_NAME.
    let resource = collector.resource_spans();
    let service = resource
        .iter()
        .filter_map(|r| r.resource.as_ref())
        .find_map(|r| string_attribute(&r.attributes, "service.name"));
    assert_eq!(service.as_deref(), Some("toolgate-test"));

    crate::support::binary::stop(spawned).await;
}

/// A tool name the client chose reaches the span as it reaches the audit line: cut to the
/// identifier limit (256 bytes), so one call cannot make a span name and attribute of any size.
#[tokio::test]
async fn an_over_long_tool_name_is_cut_in_its_span() {
    let collector = otlp_collector::start().await;
    let (upstream, _) = traced_upstream().await;
    let endpoint = collector.endpoint();
    let (_dir, spawned) = spawn_traced(
        upstream,
        "20ms",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
    );
    let mut client = client(&spawned.addr).await;
    let name = "x".repeat(64 * 1024);
    let result = exec(&mut client, &who("acme"), call(&name, "{}")).await;
    assert_eq!(result.status(), ToolStatus::InvalidArguments, "{result:?}");
    let spans = collector
        .wait_for_spans(
            |spans| spans.iter().any(|s| s.name.starts_with("execute_tool x")),
            Duration::from_secs(20),
        )
        .await;
    let span = spans
        .iter()
        .find(|s| s.name.starts_with("execute_tool x"))
        .unwrap();
    assert_eq!(span.name, format!("execute_tool {}", "x".repeat(256)));
    assert_eq!(
        attribute(span, "gen_ai.tool.name").map(|n| n.len()),
        Some(256)
    );
    assert_eq!(
        attribute(span, "error.type").as_deref(),
        Some("identifier_too_long")
    );
    crate::support::binary::stop(spawned).await;
}

#[tokio::test]
async fn shutdown_flushes_pending_spans_over_http_protobuf() {
    // An OTLP/HTTP receiver: POST /v1/traces with a protobuf ExportTraceServiceRequest.
    let received: Arc<Mutex<Vec<Span>>> = Arc::default();
    let sink = received.clone();
    let app = Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                if let Ok(spans) = spans_in(body) {
                    sink.lock().unwrap().extend(spans);
                }
                ExportTraceServiceResponseBody
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let (upstream, _) = traced_upstream().await;
    // Spans would wait a minute to be sent: only the shutdown flush can deliver them in time.
    let endpoint = format!("http://{addr}");
    let (_dir, spawned) = spawn_traced(
        upstream,
        "60s",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
    );
    let mut client = client(&spawned.addr).await;
    let result = exec(
        &mut client,
        &who("acme"),
        call("echo", r#"{"text":"flush me"}"#),
    )
    .await;
    assert_eq!(result.status(), ToolStatus::Ok);
    assert!(
        received.lock().unwrap().is_empty(),
        "nothing is sent before the batch delay"
    );
    crate::support::binary::stop(spawned).await;
    let spans = received.lock().unwrap().clone();
    assert!(
        spans.iter().any(|s| s.name == "execute_tool echo"),
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
}

/// The standard exporter settings a collector behind an API gateway needs: headers from
/// `OTEL_EXPORTER_OTLP_HEADERS` (percent-decoded) on every request, and a collector that is
/// briefly unavailable retried, not its spans lost.
#[tokio::test]
async fn grpc_export_sends_the_configured_headers_and_retries_an_unavailable_collector() {
    let collector = otlp_collector::start().await;
    collector.refuse_next(2, tonic::Code::Unavailable);
    let (upstream, _) = traced_upstream().await;
    let endpoint = collector.endpoint();
    let (_dir, spawned) = spawn_traced(
        upstream,
        "20ms",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20key-1, x-scope-orgid=team-a",
            ),
            // Often injected for every SDK in a pod: not supported here, said at start, and
            // spans still go (uncompressed).
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ],
    );
    let mut client = client(&spawned.addr).await;
    let result = exec(&mut client, &who("acme"), call("echo", r#"{"text":"a"}"#)).await;
    assert_eq!(result.status(), ToolStatus::Ok);
    let spans = collector
        .wait_for_spans(|spans| !spans.is_empty(), Duration::from_secs(20))
        .await;
    assert_eq!(spans[0].name, "execute_tool echo");
    assert_eq!(
        collector.refused(),
        2,
        "two refusals, then the retry got through"
    );
    assert_eq!(
        collector.last_header("authorization").as_deref(),
        Some("Bearer key-1")
    );
    assert_eq!(
        collector.last_header("x-scope-orgid").as_deref(),
        Some("team-a")
    );
    let logs = crate::support::binary::stop(spawned).await;
    assert!(
        logs.contains("OTLP compression is not supported; spans are sent uncompressed"),
        "said at start:\n{logs}"
    );
}

#[tokio::test]
async fn http_export_sends_the_configured_headers_and_retries_a_busy_collector() {
    // Answers 503 to the first request, then records what it is sent and how.
    type Received = Vec<(HeaderMap, Vec<Span>)>;
    let received: Arc<Mutex<Received>> = Arc::default();
    let busy_answers = Arc::new(std::sync::atomic::AtomicU32::new(1));
    let (sink, busy) = (received.clone(), busy_answers.clone());
    let app = Router::new().route(
        "/custom/traces",
        post(move |headers: HeaderMap, body: Bytes| {
            let (sink, busy) = (sink.clone(), busy.clone());
            async move {
                use axum::response::IntoResponse;
                use std::sync::atomic::Ordering;
                if busy
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
                }
                let spans = spans_in(body).expect("protobuf");
                sink.lock().unwrap().push((headers, spans));
                ExportTraceServiceResponseBody.into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let (upstream, _) = traced_upstream().await;
    // The signal's own endpoint is used as it is: no /v1/traces appended.
    let endpoint = format!("http://{addr}/custom/traces");
    let (_dir, spawned) = spawn_traced(
        upstream,
        "60s",
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=s%3Dcret"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=not-this-one"),
        ],
    );
    let mut client = client(&spawned.addr).await;
    let result = exec(&mut client, &who("acme"), call("echo", r#"{"text":"b"}"#)).await;
    assert_eq!(result.status(), ToolStatus::Ok);
    // Shutdown sends the batch; the first answer is 503, the retry is accepted.
    crate::support::binary::stop(spawned).await;
    assert_eq!(busy_answers.load(std::sync::atomic::Ordering::SeqCst), 0);
    let received = received.lock().unwrap();
    assert_eq!(received.len(), 1, "one accepted request");
    let (headers, spans) = &received[0];
    assert_eq!(headers["api-key"], "s=cret");
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert!(spans.iter().any(|s| s.name == "execute_tool echo"));
}

/// The spans of an OTLP/HTTP request body, out of their resource and scope.
fn spans_in(body: Bytes) -> Result<Vec<Span>, prost::DecodeError> {
    Ok(ExportTraceServiceRequest::decode(body)?
        .resource_spans
        .into_iter()
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect())
}

/// An empty protobuf ExportTraceServiceResponse.
struct ExportTraceServiceResponseBody;

impl axum::response::IntoResponse for ExportTraceServiceResponseBody {
    fn into_response(self) -> axum::response::Response {
        (
            [("content-type", "application/x-protobuf")],
            Vec::<u8>::new(),
        )
            .into_response()
    }
}

/// Fetches a path from the admin endpoint.
async fn admin_get(server: &TestServer, path: &str) -> (u16, String) {
    crate::support::http_get(server.admin_addr(), path).await
}

#[tokio::test]
async fn metrics_parse_and_count_the_calls_made() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        exec(&mut client, &who("acme"), call("echo", r#"{"text":"x"}"#)).await;
    }
    for name in ["model_invented_tool_1", "model_invented_tool_2"] {
        exec(&mut client, &who("acme"), call(name, "{}")).await;
    }
    exec(&mut client, &who("acme"), call("typed", "{}")).await;
    for _ in 0..6 {
        exec(&mut client, &who("acme"), call("limited", "{}")).await;
    }
    let (status, text) = admin_get(&server, "/metrics").await;
    assert_eq!(status, 200);
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    assert_eq!(
        value(
            "toolgate_tool_calls_total",
            &[("tool", "echo"), ("status", "OK")]
        ),
        3.0
    );
    assert_eq!(
        value(
            "toolgate_tool_calls_total",
            &[("tool", "(unknown)"), ("status", "NOT_FOUND")]
        ),
        2.0
    );
    assert_eq!(
        value(
            "toolgate_refusals_total",
            &[("stage", "schema"), ("error_type", "schema_violation")]
        ),
        1.0
    );
    assert_eq!(
        value("toolgate_rate_limited_total", &[("tool", "limited")]),
        1.0
    );
    assert_eq!(value("toolgate_tool_calls_total", &[]), 12.0);
    assert_eq!(value("toolgate_calls_in_flight", &[]), 0.0);
    assert_eq!(value("toolgate_audit_events_dropped", &[]), 0.0);
    assert_eq!(
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == "toolgate_catalog_revision_info")
            .count(),
        1,
        "one revision is served"
    );
    // Model-invented names never become labels.
    assert!(!text.contains("model_invented_tool"));
    assert_eq!(admin_get(&server, "/healthz").await.0, 200);
    assert_eq!(admin_get(&server, "/readyz").await.0, 200);
    server.stop().await;
}
