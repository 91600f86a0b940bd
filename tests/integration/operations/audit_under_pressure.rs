//! An executed call always has its audit event (issue 11, items 1–5): slots are reserved before
//! anything runs, so a stuck sink with cancelling clients loses nothing; a panic is an internal
//! error; refused callers are audited, bounded in rate, without token material; a backend's own
//! words reach records only for tools that record arguments; a partial write is continued, never
//! repeated or torn. Nothing is lost through a tiny queue and a slow sink, a stuck sink refuses
//! calls when configured to fail closed, and OTLP logs retry a failing collector.

use std::{
    collections::{HashMap, HashSet},
    io::Read,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;
use tonic::Code;
use toolgate::{
    proto::{self, ApprovalDecision, ToolStatus},
    settings::Env,
};

use crate::support::python;
use crate::{
    otlp_collector::string_attribute,
    support::binary::spawn,
    support::{
        STAGES, TestServer, Who, call, exec, execute_request, http_get, metric, mkfifo,
        stuck_fifo_reader, who,
    },
};

#[tokio::test]
async fn every_executed_call_and_every_decision_has_exactly_one_event_under_a_stuck_sink() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("audit.fifo");
    mkfifo(&fifo);
    // The sink: a FIFO with a one-page buffer whose reader reads nothing until released.
    let mut file = stuck_fifo_reader(&fifo, 4096);
    let (release, released) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        released.recv().unwrap();
        let mut all = String::new();
        file.read_to_string(&mut all).unwrap();
        all
    });
    let yaml = STAGES.replacen(
        "version: 1\n",
        &format!(
            "version: 1\nserver: {{ shutdown_grace: 5s }}\naudit: {{ sink: file, path: {}, queue_capacity: 32 }}\n",
            fifo.display()
        ),
        1,
    );
    let server = TestServer::start_raw(&yaml).await;
    let mut client = server.client().await;
    let alice = who("acme").subject("alice");
    let mut approval_ids = Vec::new();
    for i in 0..5 {
        let r = exec(
            &mut client,
            &alice,
            call("approve_me", &format!(r#"{{"order":"o-{i}"}}"#)),
        )
        .await;
        approval_ids.push(r.approval_id);
    }
    // Calls whose clients give up after `timeout`, and decisions likewise.
    let calls = |range: std::ops::Range<usize>, timeout: Duration| {
        let client = client.clone();
        range.map(move |i| {
            let mut client = client.clone();
            async move {
                let mut c = call("echo", &format!(r#"{{"text":"{i}"}}"#));
                c.call_id = format!("c-{i}");
                let mut request = who("acme").request(execute_request(c));
                request.set_timeout(timeout);
                client.execute_tool(request).await.map(|_| ())
            }
        })
    };
    let decide = |ids: &[String], timeout: Duration| {
        let server = &server;
        ids.iter()
            .cloned()
            .map(move |id| async move {
                let mut approvals = server.approvals().await;
                let mut request = who("acme")
                    .subject("bob")
                    .scopes("toolgate:approve")
                    .request(proto::DecideApprovalRequest {
                        approval_id: id,
                        decision: ApprovalDecision::Approve as i32,
                        reason: "fine".into(),
                    });
                request.set_timeout(timeout);
                approvals.decide_approval(request).await.map(|_| ())
            })
            .collect::<Vec<_>>()
    };
    // The flood's first wave: twenty calls, whose events (with the five above) are more than
    // the pipe holds, so the writer is stuck from here on; the queue still has room for them.
    let first = futures::future::join_all(calls(0..20, Duration::from_secs(10))).await;
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    // Three decisions reach the server while the sink is stuck and the queue has room: each
    // takes its slot and is applied.
    let applied =
        futures::future::join_all(decide(&approval_ids[..3], Duration::from_secs(10))).await;
    assert!(applied.iter().all(Result::is_ok), "{applied:?}");
    // The second wave fills the queue: calls and two more decisions wait for slots that do not
    // come, and their clients give up after 300 ms.
    let (call_results, decision_results) = tokio::join!(
        futures::future::join_all(calls(20..60, Duration::from_millis(300))),
        futures::future::join_all(decide(&approval_ids[3..], Duration::from_millis(300)))
    );
    let gave_up = call_results
        .iter()
        .chain(&decision_results)
        .filter(|r| {
            r.as_ref()
                .is_err_and(|s| s.code() == Code::DeadlineExceeded || s.code() == Code::Cancelled)
        })
        .count();
    assert!(gave_up > 0, "the sink never stuck: nothing waited");
    // Which decisions took effect, read before the sink is released.
    let mut approvals = server.approvals().await;
    let mut decided = 0;
    for id in &approval_ids {
        let approval = approvals
            .get_approval(
                who("acme")
                    .subject("bob")
                    .scopes("toolgate:approve")
                    .request(proto::GetApprovalRequest {
                        approval_id: id.clone(),
                    }),
            )
            .await;
        // The queue may still be full; a read needs no slot.
        if approval.unwrap().into_inner().approval.unwrap().state()
            == proto::ApprovalState::Approved
        {
            decided += 1;
        }
    }
    let executed = server.builtins().executions();
    assert!(
        executed >= 20 && decided >= 3,
        "{executed} calls ran and {decided} decisions took effect under the stuck sink"
    );
    release.send(()).unwrap();
    server.stop().await;
    let events: Vec<Value> = reader
        .join()
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("whole JSON lines"))
        .collect();
    let ok_calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call" && e["tool"] == "echo")
        .collect();
    let ids: HashSet<&str> = ok_calls
        .iter()
        .filter_map(|e| e["call_id"].as_str())
        .collect();
    assert_eq!(ids.len(), ok_calls.len(), "an event was written twice");
    assert!(ok_calls.iter().all(|e| e["status"] == "OK"), "{ok_calls:?}");
    assert_eq!(
        ok_calls.len() as u64,
        executed,
        "every call that ran has its event ({} ran)",
        executed
    );
    let decision_events = events
        .iter()
        .filter(|e| e["kind"] == "approval_decision")
        .count();
    assert_eq!(
        decision_events, decided,
        "every applied decision has its event"
    );
}

#[tokio::test]
async fn a_panic_in_a_call_is_an_audited_internal_error_and_the_sidecar_keeps_serving() {
    let catalog = STAGES.replace(
        "tools:\n",
        "tools:\n  - { name: boom, description: Panics., risk_level: read_only, executor: { builtin: panic }, input_schema: { type: object } }\n",
    );
    let server = TestServer::start(&catalog).await;
    let mut client = server.client().await;
    let mut c = call("boom", "{}");
    c.call_id = "boom-1".into();
    let result = exec(&mut client, &who("acme"), c).await;
    assert_eq!(
        (result.status(), result.error_type.as_str()),
        (ToolStatus::Error, "internal"),
        "{result:?}"
    );
    let event = server.wait_for_audit(|e| e["call_id"] == "boom-1").await;
    assert_eq!(
        (event["status"].as_str(), event["error_type"].as_str()),
        (Some("ERROR"), Some("internal")),
        "{event}"
    );
    let after = exec(
        &mut client,
        &who("acme"),
        call("echo", r#"{"text":"still here"}"#),
    )
    .await;
    assert_eq!(after.model_text, "still here");
    server.stop().await;
}

const JWT_SECRET: &str = "an-hs256-test-secret-that-is-long-enough";

fn jwt_catalog(extra_audit: &str) -> String {
    format!(
        r#"version: 1
identity:
  jwt: {{ hs256_secret_env: TEST_JWT_SECRET, audience: [toolgate] }}
audit: {{ sink: file, path: AUDIT_PATH{extra_audit} }}
tenants: {{ acme: {{}} }}
tools:
  - {{ name: echo, description: Echo., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object, properties: {{ text: {{ type: string }} }} }} }}
"#
    )
}

async fn jwt_server(extra_audit: &str) -> TestServer {
    TestServer::start_with_env(
        &jwt_catalog(extra_audit),
        &Env::default().with("TEST_JWT_SECRET", JWT_SECRET),
    )
    .await
}

fn token(claims: Value) -> String {
    crate::support::hs256_jwt(JWT_SECRET, &claims)
}

fn now() -> u64 {
    u64::try_from(crate::support::START_UNIX_MS / 1000).unwrap()
}

#[tokio::test]
async fn refused_callers_are_audited_without_token_material_and_bounded_in_rate() {
    let server = jwt_server("").await;
    let mut client = server.client().await;
    let expired =
        token(serde_json::json!({"tenant": "acme", "aud": "toolgate", "exp": now() - 3600}));
    let other_audience =
        token(serde_json::json!({"tenant": "acme", "aud": "someone-else", "exp": now() + 600}));
    let forged = format!(
        "{}x",
        token(serde_json::json!({"tenant": "acme", "aud": "toolgate", "exp": now() + 600}))
    );
    let callers = [
        Who::token(&expired),
        Who::token(&other_audience),
        Who::token(&forged),
        who("acme"), // dev headers, with dev identity off
    ];
    for caller in &callers {
        let err = client
            .execute_tool(caller.request(execute_request(call("echo", r#"{"text":"x"}"#))))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
    }
    let events = server.audit_events().await;
    assert_eq!(events.len(), 4, "{events:?}");
    for event in &events {
        assert_eq!(
            (
                event["kind"].as_str(),
                event["status"].as_str(),
                event["rpc"].as_str()
            ),
            (
                Some("authentication_failed"),
                Some("UNAUTHENTICATED"),
                Some("ExecuteTool")
            ),
            "{event}"
        );
        assert!(
            event["peer"]
                .as_str()
                .is_some_and(|p| p.starts_with("127.0.0.1:"))
        );
    }
    let text = std::fs::read_to_string(&server.audit_path).unwrap();
    // No part of a token: not its signature, header or claims segment, nor any 16 characters
    // of it in a row (which also covers a token cut short).
    for secret in [&expired, &other_audience, &forged] {
        for segment in secret.split('.') {
            assert!(
                !text.contains(segment),
                "a token segment in the audit log: {segment}"
            );
        }
        let bytes = secret.as_bytes();
        for window in bytes.windows(16) {
            let window = std::str::from_utf8(window).unwrap();
            assert!(
                !text.contains(window),
                "token material in the audit log: {window}"
            );
        }
    }
    server.stop().await;

    // A flood: at most the burst is written, the rest is counted.
    let server = jwt_server(", authentication_failures: { quota: 10/s, burst: 5 }").await;
    let mut client = server.client().await;
    for _ in 0..50 {
        let _ = client
            .list_tools(Who::token(&forged).request(proto::ListToolsRequest {}))
            .await
            .unwrap_err();
    }
    assert_eq!(server.audit_events().await.len(), 5);
    let (_, page) = http_get(server.admin_addr(), "/metrics").await;
    assert_eq!(
        metric(&page, "toolgate_audit_refused_callers_suppressed", &[]),
        45.0
    );
    // Time passes: the next refused caller is written, saying how many were left out.
    server.clock.advance(Duration::from_secs(1));
    let _ = client
        .list_tools(Who::token(&forged).request(proto::ListToolsRequest {}))
        .await
        .unwrap_err();
    let events = server.audit_events().await;
    assert_eq!(events.len(), 6);
    assert_eq!(events[5]["suppressed"], 45);
    server.stop().await;
}

#[tokio::test]
async fn a_backends_own_words_reach_records_only_for_tools_that_record_arguments() {
    // The program fails and echoes its input on stderr, as many do.
    let script = "import sys; sys.stderr.write('cannot charge ' + sys.stdin.read()); sys.exit(2)";
    let tool = |name: &str, record: &str| {
        format!(
            "  - name: {name}\n    description: Charges a card.\n    risk_level: read_only\n    input_schema: {{ type: object }}\n{record}    executor:\n      process:\n        command: {}\n        args: [\"-c\", {}]\n        env: [PATH]\n",
            python(),
            serde_json::to_string(script).unwrap()
        )
    };
    let catalog = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\ntools:\n{}{}",
        tool("charge", ""),
        tool(
            "charge_recorded",
            "    record_arguments: true\n    redact: [/card/number]\n"
        )
    );
    let env = Env::default().with("PATH", &std::env::var("PATH").unwrap_or_default());
    let server = TestServer::start_with_env(&catalog, &env).await;
    let mut client = server.client().await;
    let card = "4111111111111111";
    let args = format!(r#"{{"card":{{"number":"{card}"}}}}"#);
    for (tool, id) in [("charge", "plain"), ("charge_recorded", "recorded")] {
        let mut c = call(tool, &args);
        c.call_id = id.into();
        let r = exec(&mut client, &who("acme"), c).await;
        assert_eq!(r.error_type, "tool_failed", "{r:?}");
        // The model may read the backend's words: they explain the failure.
        assert!(r.model_text.contains(card), "{r:?}");
    }
    let plain = server.wait_for_audit(|e| e["call_id"] == "plain").await;
    let reason = plain["reason"].as_str().unwrap();
    assert!(
        !reason.contains(card),
        "card number in the audit reason: {reason}"
    );
    assert!(
        !reason.contains("cannot charge"),
        "backend text in the audit: {reason}"
    );
    let recorded = server.wait_for_audit(|e| e["call_id"] == "recorded").await;
    let reason = recorded["reason"].as_str().unwrap();
    assert!(reason.contains("cannot charge"), "{reason}");
    assert!(
        !reason.contains(card) && reason.contains("[redacted]"),
        "{reason}"
    );
    server.stop().await;
}

/// The soft and hard file-size limits of a process.
#[expect(unsafe_code, reason = "prlimit(2) has no safe wrapper")]
fn set_file_size_limit(pid: u32, bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit on a child this test started; only its file-size limit changes.
    let rc = unsafe {
        libc::prlimit(
            libc::pid_t::try_from(pid).unwrap(),
            libc::RLIMIT_FSIZE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[tokio::test]
async fn a_partial_write_is_continued_never_repeated_or_torn() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(
        &catalog,
        STAGES.replacen(
            "version: 1\n",
            &format!(
                "version: 1\naudit: {{ sink: file, path: {} }}\n",
                audit.display()
            ),
            1,
        ),
    )
    .unwrap();
    let server = spawn(&["--config", catalog.to_str().unwrap()]);
    let mut client = crate::support::binary::client(&server.addr).await;
    let echo = |i: usize| {
        let mut c = call("echo", &format!(r#"{{"text":"{i}"}}"#));
        c.call_id = format!("w-{i}");
        c
    };
    exec(&mut client, &who("acme"), echo(0)).await;
    // Wait for the first line, then allow half a line more: the next write is cut mid-line.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&audit).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(std::time::Instant::now() < deadline, "no first audit line");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let size = std::fs::metadata(&audit).unwrap().len();
    set_file_size_limit(server.child.id(), size + 100);
    for i in 1..=5 {
        let r = exec(&mut client, &who("acme"), echo(i)).await;
        assert_eq!(r.status(), ToolStatus::Ok);
    }
    server.wait_for_log("audit sink write failed", 1);
    // Each failed write is counted, as it is logged.
    let (_, page) = http_get(server.admin_addr.parse().unwrap(), "/metrics").await;
    let errors = metric(&page, "toolgate_audit_write_errors", &[]);
    assert!(errors >= 1.0, "toolgate_audit_write_errors {errors}");
    set_file_size_limit(server.child.id(), libc::RLIM_INFINITY);
    crate::support::binary::stop(server).await;
    let text = std::fs::read_to_string(&audit).unwrap();
    let ids: Vec<String> = text
        .lines()
        .map(|l| {
            let event: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("torn line {l:?}: {e}"));
            event["call_id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids, (0..=5).map(|i| format!("w-{i}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn nothing_is_lost_through_a_tiny_queue_and_a_slow_sink() {
    // The sink is a FIFO that this test drains slowly: writers must wait, not drop.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("audit.fifo");
    crate::support::mkfifo(&fifo);
    let reader_path = fifo.clone();
    let reader = std::thread::spawn(move || {
        let mut file = std::fs::File::open(reader_path).unwrap();
        let mut all = Vec::new();
        let mut chunk = [0u8; 512];
        loop {
            match file.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    all.extend_from_slice(&chunk[..n]);
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        String::from_utf8(all).unwrap()
    });
    let yaml = STAGES.replacen(
        "version: 1\n",
        &format!(
            "version: 1\naudit: {{ sink: file, path: {}, queue_capacity: 1 }}\n",
            fifo.display()
        ),
        1,
    );
    let server = TestServer::start_raw(&yaml).await;
    let client = server.client().await;
    let results = futures::future::join_all((0..40).map(|i| {
        let mut client = client.clone();
        async move {
            exec(
                &mut client,
                &who("acme"),
                call("echo", &format!(r#"{{"text":"{i}"}}"#)),
            )
            .await
        }
    }))
    .await;
    assert!(results.iter().all(|r| r.status() == ToolStatus::Ok));
    server.stop().await;
    let written = reader.join().unwrap();
    let events: Vec<serde_json::Value> = written
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 40, "one event per call, none lost");
    assert!(
        events
            .iter()
            .all(|e| e["kind"] == "tool_call" && e["status"] == "OK")
    );
}

#[tokio::test]
async fn fail_closed_refuses_calls_when_the_sink_is_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("audit.fifo");
    crate::support::mkfifo(&fifo);
    // A reader that opens the pipe and never reads: once the pipe buffer fills, writes block.
    let stuck = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    let yaml = STAGES.replacen(
        "version: 1\n",
        &format!(
            "version: 1\nserver: {{ shutdown_grace: 1s }}\naudit: {{ sink: file, path: {}, queue_capacity: 4, when_full: refuse }}\n",
            fifo.display()
        ),
        1,
    );
    let server = TestServer::start_raw(&yaml).await;
    let mut client = server.client().await;
    let mut statuses: HashMap<&'static str, usize> = HashMap::new();
    let mut first_refusal = None;
    // Each event is a few hundred bytes; a 64 KiB pipe fills within a few hundred calls.
    for i in 0..2000 {
        let r = exec(
            &mut client,
            &who("acme"),
            call("echo", &format!(r#"{{"text":"{i}"}}"#)),
        )
        .await;
        let key = match r.status() {
            ToolStatus::Ok => "ok",
            ToolStatus::Unavailable => {
                first_refusal.get_or_insert(r.clone());
                "refused"
            }
            _ => "other",
        };
        *statuses.entry(key).or_default() += 1;
        if statuses.get("refused").copied().unwrap_or(0) >= 5 {
            break;
        }
    }
    let refusal = first_refusal.expect("calls were refused once the sink stuck");
    assert_eq!(
        (refusal.error_type.as_str(), refusal.retryable),
        ("audit_unavailable", true)
    );
    assert_eq!(statuses.get("other"), None);
    assert!(statuses["ok"] > 10, "{statuses:?}");
    // The refused calls did not run: builtin executions equal the calls that returned OK.
    assert_eq!(server.builtins().executions() as usize, statuses["ok"]);
    // Shutdown gives up draining the stuck sink after the grace period, loudly.
    server.stop().await;
    drop(stuck);
}

/// An OTLP logs receiver that refuses its first export, to prove the sink retries.
#[derive(Clone, Default)]
struct LogsReceiver {
    records: Arc<Mutex<Vec<opentelemetry_proto::tonic::logs::v1::LogRecord>>>,
    refused_once: Arc<std::sync::atomic::AtomicBool>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::LogsService
    for LogsReceiver
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest,
        >,
    ) -> Result<
        tonic::Response<opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse>,
        tonic::Status,
    > {
        if !self
            .refused_once
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(tonic::Status::unavailable("collector warming up"));
        }
        let records = request
            .into_inner()
            .resource_logs
            .into_iter()
            .flat_map(|r| r.scope_logs)
            .flat_map(|s| s.log_records);
        self.records.lock().unwrap().extend(records);
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tokio::test]
async fn audit_events_go_to_otlp_logs_and_a_failing_collector_is_retried() {
    let receiver = LogsReceiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::LogsServiceServer::new(receiver.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap()
    });
    let yaml = STAGES.replacen(
        "version: 1\n",
        &format!("version: 1\naudit: {{ sink: otlp, endpoint: \"http://{addr}\" }}\n"),
        1,
    );
    let server = TestServer::start_raw(&yaml).await;
    let mut client = server.client().await;
    for text in ["a", "b", "c"] {
        assert_eq!(
            exec(
                &mut client,
                &who("acme"),
                call("echo", &format!(r#"{{"text":"{text}"}}"#))
            )
            .await
            .status(),
            ToolStatus::Ok
        );
    }
    exec(&mut client, &who("acme"), call("nope", "{}")).await;
    server.stop().await;
    let records = receiver.records.lock().unwrap().clone();
    assert_eq!(
        records.len(),
        4,
        "every event arrived once, after the refused export was retried"
    );
    let bodies: Vec<serde_json::Value> = records
        .iter()
        .map(|r| match r.body.as_ref().and_then(|b| b.value.clone()) {
            Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(json)) => {
                serde_json::from_str(&json).unwrap()
            }
            other => panic!("unexpected body {other:?}"),
        })
        .collect();
    assert_eq!(bodies.iter().filter(|b| b["status"] == "OK").count(), 3);
    assert_eq!(bodies[3]["error_type"], "tool_not_found");
    assert_eq!(
        string_attribute(&records[0].attributes, "toolgate.tenant").as_deref(),
        Some("acme")
    );
}
