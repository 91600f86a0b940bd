//! Trace promises of docs/observability.md ("Traces") beyond observability.rs, from the real binary
//! to the in-process OTLP collector: the sampler samples, `tracestate` is kept,
//! OTEL_RESOURCE_ATTRIBUTES reaches the resource, process and MCP calls are CLIENT spans whose
//! context reaches the MCP server, and the `execute_tools` and `list_tools` spans carry their
//! attributes.

use std::time::Duration;

use opentelemetry_proto::tonic::{common::v1::any_value, trace::v1::Span};
use toolgate::proto::{self, ToolStatus};

use crate::support::python;
use crate::{
    otlp_collector::{self, string_attribute},
    support::binary::{Spawned, client, spawn_with_env},
    support::{call, execute_request, who},
};

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";
const TRACESTATE: &str = "vendor=opaque-1,other=x";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attribute of any type, as text (`true`, `3`, `acme`).
fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|value| match value {
            any_value::Value::StringValue(s) => s.clone(),
            any_value::Value::BoolValue(b) => b.to_string(),
            any_value::Value::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

/// A request within the caller's span, with its tracestate.
fn traced<T>(body: T) -> tonic::Request<T> {
    let mut request = who("acme").request(body);
    let md = request.metadata_mut();
    md.insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    md.insert("tracestate", TRACESTATE.parse().unwrap());
    request
}

async fn stop(spawned: Spawned) {
    crate::support::binary::stop(spawned).await;
}

fn catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
telemetry: {{ batch_delay: 20ms }}
tenants: {{ acme: {{}} }}
mcp_servers:
  dyn:
    command: ["{py}", "{root}/tests/fixtures/mcp_dynamic_server.py"]
    env: [PATH, HOME]
    tools:
      trace_context: {{ risk_level: read_only }}
tools:
  - {{ name: echo, description: Echoes., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}
  - name: count
    description: Counts its arguments.
    risk_level: read_only
    input_schema: {{ type: object }}
    executor:
      process:
        command: {py}
        args: ["-c", "import json,sys; print(len(json.load(sys.stdin)))"]
        env: [PATH, HOME]
"#,
        py = python(),
        root = env!("CARGO_MANIFEST_DIR")
    );
    let path = dir.join("catalog.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// PATH and HOME for the MCP and process children, and the OTLP settings.
fn env_for(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=ci,team=agents".into(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_spans_tracestate_resource_and_server_span_attributes() {
    let collector = otlp_collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = catalog(dir.path());
    let env = env_for(&collector.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let spawned = spawn_with_env(&["--config", config.to_str().unwrap()], &env);
    let mut grpc = client(&spawned.addr).await;
    // The MCP tool appears once its server has listed it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let listed = grpc
            .list_tools(traced(proto::ListToolsRequest {}))
            .await
            .unwrap()
            .into_inner();
        if listed.tools.iter().any(|t| t.name == "dyn.trace_context") {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the MCP tool never appeared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mcp = grpc
        .execute_tool(traced(execute_request(call("dyn.trace_context", "{}"))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(mcp.status(), ToolStatus::Ok, "{mcp:?}");
    let process = grpc
        .execute_tool(traced(execute_request(call("count", r#"{"a":1,"b":2}"#))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(
        (process.status(), process.model_text.trim()),
        (ToolStatus::Ok, "2")
    );
    let batch = grpc
        .execute_tools(traced(proto::ExecuteToolsRequest {
            calls: vec![
                call("echo", r#"{"text":"a"}"#),
                call("echo", r#"{"text":"b"}"#),
                call("echo", r#"{"text":"c"}"#),
            ],
            run_id: "run-1".into(),
            parallel: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.results.len(), 3);
    drop(grpc);
    stop(spawned).await;

    let spans: Vec<Span> = collector
        .spans()
        .into_iter()
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();

    // The caller's tracestate is kept on every span of its trace.
    assert!(!spans.is_empty());
    for span in &spans {
        assert_eq!(span.trace_state, TRACESTATE, "{}", span.name);
    }

    // process and MCP calls leave the sidecar: CLIENT spans under their execute_tool span.
    for (client_span, tool, executor) in [
        ("mcp dyn.trace_context", "dyn.trace_context", "mcp"),
        ("process count", "count", "process"),
    ] {
        let parent = named(&format!("execute_tool {tool}"));
        let backend = named(client_span);
        assert_eq!((parent.len(), backend.len()), (1, 1), "{names:?}");
        assert_eq!(backend[0].kind, 3, "CLIENT");
        assert_eq!(backend[0].parent_span_id, parent[0].span_id);
        assert_eq!(
            attribute(backend[0], "toolgate.executor").as_deref(),
            Some(executor)
        );
        assert_eq!(
            attribute(backend[0], "gen_ai.tool.name").as_deref(),
            Some(tool)
        );
        assert_eq!(
            attribute(parent[0], "toolgate.executor").as_deref(),
            Some(executor)
        );
    }
    // The MCP server got the CLIENT span's context.
    let mcp_span = named("mcp dyn.trace_context")[0];
    assert_eq!(
        mcp.model_text,
        format!("00-{TRACE_ID}-{}-01", hex(&mcp_span.span_id))
    );

    // execute_tools: SERVER, under the caller, with tenant, call count and parallel.
    let turn = named("execute_tools");
    assert_eq!(turn.len(), 1, "{names:?}");
    assert_eq!(
        (turn[0].kind, hex(&turn[0].parent_span_id)),
        (2, CALLER_SPAN.to_owned())
    );
    for (key, value) in [
        ("toolgate.tenant", "acme"),
        ("toolgate.calls", "3"),
        ("toolgate.parallel", "true"),
    ] {
        assert_eq!(attribute(turn[0], key).as_deref(), Some(value), "{key}");
    }
    // list_tools: SERVER, with tenant, the number of tools shown and the revision answered.
    let list = named("list_tools");
    let last = list
        .iter()
        .find(|s| attribute(s, "toolgate.tools").as_deref() == Some("3"))
        .expect("the list_tools span that saw the MCP tool");
    assert_eq!(last.kind, 2, "SERVER");
    assert_eq!(hex(&last.parent_span_id), CALLER_SPAN);
    assert_eq!(attribute(last, "toolgate.tenant").as_deref(), Some("acme"));
    assert_eq!(
        attribute(last, "toolgate.catalog_revision").as_deref(),
        Some(listed.catalog_revision.as_str())
    );

    // The resource: OTEL_RESOURCE_ATTRIBUTES, beside the service name.
    let resource = collector
        .resource_spans()
        .into_iter()
        .find_map(|r| r.resource)
        .expect("a resource");
    for (key, value) in [
        ("deployment.environment", "ci"),
        ("team", "agents"),
        ("service.name", "toolgate"),
    ] {
        assert_eq!(
            string_attribute(&resource.attributes, key).as_deref(),
            Some(value),
            "{key}"
        );
    }
}

/// Starts the binary on a one-tool catalog (`echo`) with these variables and makes `calls`
/// untraced echo calls, each OK. The directory holds the catalog while the binary runs.
async fn echo_calls(envs: &[(&str, &str)], calls: usize) -> (Spawned, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    std::fs::write(
        &config,
        "version: 1\nidentity: { dev_identity: true }\ntenants: { acme: {} }\ntools:\n  - { name: echo, description: Echoes., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object } }\n",
    )
    .unwrap();
    let spawned = spawn_with_env(&["--config", config.to_str().unwrap()], envs);
    let mut grpc = client(&spawned.addr).await;
    for i in 0..calls {
        let r = crate::support::exec(
            &mut grpc,
            &who("acme"),
            call("echo", &format!(r#"{{"text":"{i}"}}"#)),
        )
        .await;
        assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    }
    (spawned, dir)
}

/// Runs 20 untraced echo calls against a binary with this sampler ratio and returns the spans
/// exported (the binary's shutdown flushes every pending span, so nothing is still on its way).
async fn exported_with_ratio(ratio: &str) -> usize {
    let collector = otlp_collector::start().await;
    let endpoint = collector.endpoint();
    let (spawned, _dir) = echo_calls(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", ratio),
        ],
        20,
    )
    .await;
    stop(spawned).await;
    collector
        .spans()
        .iter()
        .filter(|s| s.name == "execute_tool echo")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traceidratio_sampler_exports_none_at_0_and_all_at_1() {
    assert_eq!(exported_with_ratio("1").await, 20);
    assert_eq!(exported_with_ratio("0").await, 0);
}

/// A collector that takes connections and never answers: the one export request in flight hangs
/// (until the exporter's 5 s timeout), the queue of one span fills, and every span beyond it is
/// dropped — counted in `toolgate_spans_dropped`, while the calls themselves go on unharmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_dropped_with_the_export_queue_full_are_counted_and_calls_go_on() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    // Holds every connection open without reading from it.
    let silent_collector = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let (spawned, _dir) = echo_calls(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "1"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
        ],
        10,
    )
    .await;
    let (status, page) =
        crate::support::http_get(spawned.admin_addr.parse().unwrap(), "/metrics").await;
    assert_eq!(status, 200);
    // Ten spans: at most one taken by the hanging request, one waiting in the queue.
    let dropped = crate::support::metric(&page, "toolgate_spans_dropped", &[]);
    assert!((8.0..=9.0).contains(&dropped), "{dropped} dropped:\n{page}");
    assert_eq!(
        crate::support::metric(&page, "toolgate_spans_export_failed", &[]),
        0.0,
        "the request in flight has not failed yet"
    );
    let logs = crate::support::binary::stop(spawned).await;
    assert!(
        logs.contains("span export queue full"),
        "the first drop is logged:\n{logs}"
    );
    silent_collector.abort();
}
