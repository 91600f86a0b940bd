//! Audit promises of docs/observability.md ("Audit events"): opt-in `arguments` with `redact`, the
//! call's `trace_id`/`span_id` in file events and in OTLP log records, `audit.endpoint` falling
//! back to the traces endpoint, `fsync: never|batch|always` (seen in the real binary's system
//! calls) and `sink: none`.

use std::{
    io::Read,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};
use toolgate::proto::{self, ToolStatus};

use crate::{
    otlp_collector,
    support::binary::{client, spawn_with_env, spawn_with_stdout, spawn_wrapped, wait_exit},
    support::{STAGES, TestServer, call, exec, execute_request, who},
};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SIGTERM to the process and a wait (bounded) for exit 0; returns its logs.
fn events_in(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn recorded_arguments_are_redacted_and_only_for_tools_that_opt_in() {
    let yaml = STAGES.replace(
        "tools:\n",
        r#"tools:
  - name: pay
    description: Records its arguments, with the card number redacted.
    risk_level: read_only
    record_arguments: true
    redact: ["/card/number", "/cvc"]
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { tenant: { type: string } } }
    bind: { tenant: "${caller.tenant}" }
"#,
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let args = r#"{"card":{"number":"4111111111111111","holder":"Ada"},"cvc":"737","amount":12}"#;
    assert_eq!(
        exec(&mut client, &who("acme"), call("pay", args))
            .await
            .status(),
        ToolStatus::Ok
    );
    // The same secret to a tool that does not opt in.
    let r = exec(
        &mut client,
        &who("acme"),
        call("greet", r#"{"name":"4111111111111111"}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok);
    let events = server.audit_events().await;
    let pay = events.iter().find(|e| e["tool"] == "pay").unwrap();
    // The bound arguments, as the backend got them, with each redacted pointer replaced.
    assert_eq!(
        pay["arguments"],
        json!({"card": {"number": "[redacted]", "holder": "Ada"}, "cvc": "[redacted]", "amount": 12, "tenant": "acme"})
    );
    assert_eq!(pay["arguments_sha256"].as_str().map(str::len), Some(64));
    let greet = events.iter().find(|e| e["tool"] == "greet").unwrap();
    assert!(greet.get("arguments").is_none(), "{greet}");
    let text = std::fs::read_to_string(&server.audit_path).unwrap();
    assert!(
        !text.contains("4111111111111111") && !text.contains("737"),
        "{text}"
    );
    server.stop().await;
}

/// A catalog with audit to `audit` (a file) or, when `None`, to OTLP with no endpoint of its own.
fn traced_catalog(audit: Option<&Path>) -> String {
    let sink = match audit {
        Some(path) => format!("{{ sink: file, path: {} }}", path.display()),
        None => "{ sink: otlp }".to_owned(),
    };
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
telemetry: {{ batch_delay: 20ms }}
audit: {sink}
tenants: {{ acme: {{}} }}
tools:
  - {{ name: echo, description: Echoes., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}
"#
    )
}

async fn traced_echo(addr: &str, id: &str) {
    let mut c = call("echo", r#"{"text":"traced"}"#);
    c.call_id = id.into();
    let mut request = who("acme").request(execute_request(c));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    let r = client(addr)
        .await
        .execute_tool(request)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Ok);
}

/// The exported `execute_tool` span of the call: its span id, in the caller's trace.
async fn exported_span(collector: &otlp_collector::Collector, id: &str) -> String {
    let spans = collector
        .wait_for_spans(
            |spans| {
                spans.iter().any(|s| {
                    otlp_collector::string_attribute(&s.attributes, "gen_ai.tool.call.id")
                        .as_deref()
                        == Some(id)
                })
            },
            Duration::from_secs(20),
        )
        .await;
    let span = spans
        .iter()
        .find(|s| {
            otlp_collector::string_attribute(&s.attributes, "gen_ai.tool.call.id").as_deref()
                == Some(id)
        })
        .unwrap();
    assert_eq!(hex(&span.trace_id), TRACE_ID);
    assert_eq!(hex(&span.parent_span_id), CALLER_SPAN);
    hex(&span.span_id)
}

#[tokio::test]
async fn file_events_carry_the_calls_trace_and_span_ids() {
    let collector = otlp_collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, traced_catalog(Some(&audit))).unwrap();
    let endpoint = collector.endpoint();
    let spawned = spawn_with_env(
        &["--config", config.to_str().unwrap()],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
    );
    traced_echo(&spawned.addr, "traced-1").await;
    // An untraced call: a fresh trace of its own, still with ids.
    let mut plain = client(&spawned.addr).await;
    exec(&mut plain, &who("acme"), call("echo", r#"{"text":"x"}"#)).await;
    let span_id = exported_span(&collector, "traced-1").await;
    crate::support::binary::stop(spawned).await;
    let events = events_in(&audit);
    let traced = events.iter().find(|e| e["call_id"] == "traced-1").unwrap();
    assert_eq!(
        (traced["trace_id"].as_str(), traced["span_id"].as_str()),
        (Some(TRACE_ID), Some(span_id.as_str())),
        "{traced}"
    );
    let other = events.iter().find(|e| e["call_id"] != "traced-1").unwrap();
    assert_eq!(
        other["trace_id"].as_str().map(str::len),
        Some(32),
        "{other}"
    );
    assert_ne!(other["trace_id"], TRACE_ID);
}

#[tokio::test]
async fn otlp_audit_uses_the_traces_endpoint_and_log_records_carry_the_ids() {
    // One OTLP endpoint for traces and logs: the catalog's otlp sink names no endpoint of its own.
    let collector = otlp_collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, traced_catalog(None)).unwrap();
    let endpoint = collector.endpoint();
    let spawned = spawn_with_env(
        &["--config", config.to_str().unwrap()],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
    );
    traced_echo(&spawned.addr, "traced-2").await;
    let span_id = exported_span(&collector, "traced-2").await;
    let records = collector
        .wait_for_logs(|r| !r.is_empty(), Duration::from_secs(20))
        .await;
    crate::support::binary::stop(spawned).await;
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(
        (hex(&record.trace_id), hex(&record.span_id)),
        (TRACE_ID.to_owned(), span_id.clone())
    );
    let body = match record.body.as_ref().and_then(|b| b.value.clone()) {
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(json)) => {
            serde_json::from_str::<Value>(&json).unwrap()
        }
        other => panic!("unexpected body {other:?}"),
    };
    assert_eq!(
        (
            body["call_id"].as_str(),
            body["trace_id"].as_str(),
            body["span_id"].as_str()
        ),
        (Some("traced-2"), Some(TRACE_ID), Some(span_id.as_str()))
    );
}

/// The binary's system calls on the audit file, from an strace log: ("write" | "fdatasync" |
/// "fsync", bytes written) in order.
fn audit_syscalls(trace: &Path, audit: &Path) -> Vec<(String, usize)> {
    let text = std::fs::read_to_string(trace).unwrap();
    let marker = format!("<{}>", audit.display());
    text.lines()
        .filter(|l| l.contains(&marker) && !l.contains("resumed>"))
        .filter_map(|l| {
            let call = l.split_whitespace().nth(1)?;
            let name = call.split('(').next()?;
            let result = l.rsplit("= ").next()?.trim().parse::<usize>().unwrap_or(0);
            matches!(name, "write" | "fdatasync" | "fsync").then(|| (name.to_owned(), result))
        })
        .collect()
}

/// The toolgate process traced by an strace whose pid is `strace`.
fn traced_child(strace: u32) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{strace}/task/{strace}/children"))
            .unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
        {
            return pid;
        }
        assert!(std::time::Instant::now() < deadline, "no traced child");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Serves STAGES with `fsync` under strace, sends 3 single calls and a parallel batch of 8, and
/// returns the audit file's system calls and the number of events written.
async fn audit_under_strace(fsync: &str) -> (Vec<(String, usize)>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let audit: PathBuf = dir.path().join("audit.jsonl");
    let trace = dir.path().join("strace.txt");
    let config = dir.path().join("catalog.yaml");
    std::fs::write(
        &config,
        STAGES.replacen(
            "version: 1\n",
            &format!(
                "version: 1\naudit: {{ sink: file, path: {}, fsync: {fsync} }}\n",
                audit.display()
            ),
            1,
        ),
    )
    .unwrap();
    let spawned = spawn_wrapped(
        &[
            "strace",
            "-f",
            "-qq",
            "-y",
            "-e",
            "trace=write,fdatasync,fsync",
            "-o",
            trace.to_str().unwrap(),
        ],
        &["--config", config.to_str().unwrap()],
        &[],
    );
    let mut grpc = client(&spawned.addr).await;
    for i in 0..3 {
        exec(
            &mut grpc,
            &who("acme"),
            call("echo", &format!(r#"{{"text":"{i}"}}"#)),
        )
        .await;
    }
    let batch = proto::ExecuteToolsRequest {
        calls: (0..8).map(|_| call("echo", r#"{"text":"b"}"#)).collect(),
        run_id: "run-1".into(),
        parallel: true,
        ..Default::default()
    };
    grpc.execute_tools(who("acme").request(batch))
        .await
        .unwrap();
    drop(grpc);
    let toolgate = traced_child(spawned.child.id());
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &toolgate.to_string()])
            .status()
            .unwrap()
            .success()
    );
    tokio::task::spawn_blocking(move || {
        let mut spawned = spawned;
        assert_eq!(wait_exit(&mut spawned.child).code(), Some(0));
    })
    .await
    .unwrap();
    let events = events_in(&audit).len();
    assert_eq!(events, 11);
    (audit_syscalls(&trace, &audit), events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_never_batch_and_always_sync_as_documented() {
    let count =
        |calls: &[(String, usize)], name: &str| calls.iter().filter(|c| c.0 == name).count();
    // never: the OS decides; no sync at all.
    let (calls, _) = audit_under_strace("never").await;
    assert!(count(&calls, "write") >= 1, "{calls:?}");
    assert_eq!(
        count(&calls, "fdatasync") + count(&calls, "fsync"),
        0,
        "{calls:?}"
    );
    // batch: each write batch is followed by a sync before the next is written.
    let (calls, _) = audit_under_strace("batch").await;
    assert!(count(&calls, "write") >= 1, "{calls:?}");
    assert_eq!(
        calls.last().map(|c| c.0.as_str()),
        Some("fdatasync"),
        "{calls:?}"
    );
    for pair in calls.windows(2) {
        if pair[0].0 == "write" {
            assert_eq!(
                pair[1].0, "fdatasync",
                "a write not synced before the next: {calls:?}"
            );
        }
    }
    // always: every event is written on its own and synced before the next is written.
    let (calls, events) = audit_under_strace("always").await;
    assert_eq!(count(&calls, "write"), events, "{calls:?}");
    for pair in calls.windows(2) {
        if pair[0].0 == "write" {
            assert_eq!(pair[1].0, "fdatasync", "{calls:?}");
        }
    }
}

/// Reads a child's stdout to its end on a thread (the child must be able to exit).
fn read_all(mut stdout: std::process::ChildStdout) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    })
}

#[tokio::test]
async fn sink_none_writes_nothing_where_stdout_would_have_every_event() {
    let dir = tempfile::tempdir().unwrap();
    for (sink, expected) in [("stdout", 3), ("none", 0)] {
        let config = dir.path().join(format!("{sink}.yaml"));
        std::fs::write(
            &config,
            toolgate::settings::DEMO_CATALOG.replace(
                "audit:\n  sink: stdout\n",
                &format!("audit:\n  sink: {sink}\n"),
            ),
        )
        .unwrap();
        let mut spawned = spawn_with_stdout(&["--config", config.to_str().unwrap()], &[]);
        let stdout = read_all(spawned.child.stdout.take().unwrap());
        let mut grpc = client(&spawned.addr).await;
        for text in ["a", "b", "c"] {
            let r = exec(
                &mut grpc,
                &who("acme"),
                call("echo", &format!(r#"{{"text":"{text}"}}"#)),
            )
            .await;
            assert_eq!(r.status(), ToolStatus::Ok);
        }
        drop(grpc);
        crate::support::binary::stop(spawned).await;
        let printed = stdout.join().unwrap();
        let events: Vec<Value> = printed
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), expected, "sink {sink}: {printed}");
    }
}
