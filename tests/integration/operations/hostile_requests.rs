//! Hostile requests against a real server: oversized, malformed and deep messages, huge
//! objects and keys a server binds get clean, bounded refusals, the server keeps serving, and
//! memory stays bounded (measured alone, in a fresh test process). Every loop is bounded in
//! count and time, and all traffic stays on loopback.

use std::time::Duration;

use serde_json::Value;
use tonic::{Code, metadata::MetadataValue};
use toolgate::proto::{self, ToolStatus, tool_gate_client::ToolGateClient};

use crate::support::{TestServer, call, exec, execute_request, who, within};

const HOSTILE: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
tools:
  - name: echo
    description: Strict.
    risk_level: read_only
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } }, required: [text], additionalProperties: false }
  - name: any
    description: Takes any object and returns it.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object }
"#;

/// Resident memory of this process, in bytes.
fn vm_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

/// `{"k0000000":0,...}` with `n` keys (12 bytes each).
fn many_keys(n: usize) -> String {
    let body: Vec<String> = (0..n).map(|i| format!("\"k{i:07}\":0")).collect();
    format!("{{{}}}", body.join(","))
}

async fn assert_alive(client: &mut ToolGateClient<tonic::transport::Channel>, after: &str) {
    let r = exec(
        client,
        &who("acme"),
        call("echo", r#"{"text":"still here"}"#),
    )
    .await;
    assert_eq!(r.model_text, "still here", "after {after}: {r:?}");
}

/// One pass of every kind of hostile request against both servers.
async fn barrage(small: &TestServer, server: &TestServer) {
    // A message over the configured gRPC maximum (64 KiB) is refused before it is decoded.
    let mut client = small.client().await;
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(100 * 1024));
    let err = client
        .execute_tool(who("acme").request(execute_request(call("echo", &big))))
        .await
        .expect_err("a message over max_message_bytes");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("too large"), "{err:?}");
    assert_alive(&mut client, "an oversized message").await;

    let mut client = server.client().await;
    // 10,000 levels of nesting: measured without recursion and refused; no stack overflow.
    for deep in [
        format!(r#"{{"text":{}{}}}"#, "[".repeat(10_000), "]".repeat(10_000)),
        "{".repeat(10_000),
        format!(
            r#"{{"text":"x","a":{}1{}}}"#,
            r#"{"b":"#.repeat(10_000),
            "}".repeat(10_000)
        ),
    ] {
        let r = exec(&mut client, &who("acme"), call("any", &deep)).await;
        assert_eq!(
            (r.status(), r.error_type.as_str(), r.refused_by.as_str()),
            (
                ToolStatus::InvalidArguments,
                "arguments_too_deep",
                "structure"
            ),
            "{r:?}"
        );
    }

    // Metadata that is not ASCII text: UNAUTHENTICATED, saying which.
    for key in ["x-toolgate-tenant", "authorization"] {
        let mut request = who("acme").request(execute_request(call("echo", r#"{"text":"x"}"#)));
        request.metadata_mut().insert(
            key,
            MetadataValue::try_from(&b"acme\xff\xfe\x80"[..]).expect("obs-text bytes are sendable"),
        );
        let err = client
            .execute_tool(request)
            .await
            .expect_err("invalid metadata");
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        assert_eq!(
            err.message(),
            format!("metadata {key} is not valid ASCII text"),
            "{err:?}"
        );
    }
    assert_alive(&mut client, "invalid metadata").await;

    // 1 MiB of metadata: a clean gRPC error, not a hang or a crash.
    let mut request = who("acme").request(execute_request(call("echo", r#"{"text":"x"}"#)));
    request
        .metadata_mut()
        .insert("x-junk", "a".repeat(1024 * 1024).parse().unwrap());
    let err = within(
        Duration::from_secs(10),
        "a call with 1 MiB of metadata",
        client.execute_tool(request),
    )
    .await
    .expect_err("1 MiB of metadata");
    assert!(
        matches!(
            err.code(),
            // The server's HTTP/2 layer refuses the header block (GOAWAY ENHANCE_YOUR_CALM,
            // too_many_continuations): RESOURCE_EXHAUSTED, or UNKNOWN when the client is still
            // writing as the connection closes.
            Code::ResourceExhausted | Code::Unknown | Code::Unavailable
        ),
        "{err:?}"
    );
    let mut client = server.client().await;
    assert_alive(&mut client, "1 MiB of metadata").await;

    // 100k keys (1.2 MB) is over max_arguments_bytes; 60k keys (720 KB) is within it and runs.
    let r = exec(&mut client, &who("acme"), call("any", &many_keys(100_000))).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.refused_by.as_str()),
        (
            ToolStatus::InvalidArguments,
            "arguments_too_large",
            "structure"
        ),
        "{}",
        r.error_message
    );
    let r = exec(&mut client, &who("acme"), call("any", &many_keys(60_000))).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{}", r.error_message);
    let echoed: serde_json::Map<String, Value> = serde_json::from_str(&r.model_text).unwrap();
    assert_eq!(echoed.len(), 60_000);
    // The same object against a strict schema: refused (the size of that refusal's text is
    // `a_schema_refusal_of_a_huge_object_has_bounded_text`).
    let r = exec(&mut client, &who("acme"), call("echo", &many_keys(60_000))).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.refused_by.as_str()),
        (ToolStatus::InvalidArguments, "schema_violation", "schema"),
        "{}",
        r.error_message.chars().take(300).collect::<String>()
    );

    // 10,000 calls in one ExecuteTools: over max_batch_calls (8 here), refused as a whole.
    let calls = (0..10_000)
        .map(|_| call("echo", r#"{"text":"x"}"#))
        .collect();
    let err = client
        .execute_tools(who("acme").request(proto::ExecuteToolsRequest {
            calls,
            run_id: "run-1".into(),
            ..Default::default()
        }))
        .await
        .expect_err("10,000 calls in one request");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(
        err.message(),
        "10000 calls in one ExecuteTools request; the limit is 128"
    );
    assert_alive(&mut client, "a 10,000-call batch").await;
}

/// Set in the child process that runs the barrage alone.
const BARRAGE_CHILD: &str = "TOOLGATE_RELIABILITY_BARRAGE_CHILD";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_clean_errors_and_memory_stays_bounded() {
    let test = crate::support::test_name(
        module_path!(),
        "hostile_input_gets_clean_errors_and_memory_stays_bounded",
    );
    if std::env::var_os(BARRAGE_CHILD).is_none() {
        // Run alone in a fresh test process, so VmRSS measures this server and nothing else
        // that the test harness happens to run in parallel.
        let out = within(
            Duration::from_secs(120),
            "the barrage process",
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([&test, "--exact", "--nocapture", "--test-threads=1"])
                .env(BARRAGE_CHILD, "1")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap();
        let report = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{report}");
        assert!(
            report.contains("1 passed"),
            "the barrage did not run: {report}"
        );
        eprintln!(
            "{}",
            report
                .lines()
                .filter(|l| l.starts_with("rss"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        return;
    }
    let small = TestServer::start(&HOSTILE.replace(
        "tenants:",
        "limits: { max_message_bytes: 65536, max_batch_calls: 8 }\ntenants:",
    ))
    .await;
    let server = TestServer::start(HOSTILE).await;
    let mut client = server.client().await;
    assert_alive(&mut client, "start-up").await;
    let before = vm_rss();
    const ROUNDS: usize = 4;
    let mut after_first = 0;
    for round in 0..ROUNDS {
        within(
            Duration::from_secs(60),
            "a barrage round",
            barrage(&small, &server),
        )
        .await;
        if round == 0 {
            after_first = vm_rss();
        }
        eprintln!("rss-round {round}: {} MiB", vm_rss() / (1024 * 1024));
    }
    let after = vm_rss();
    const MIB: u64 = 1024 * 1024;
    eprintln!(
        "rss: before {} MiB, after round 1 {} MiB, after round {ROUNDS} {} MiB",
        before / MIB,
        after_first / MIB,
        after / MIB
    );
    // Measured here: ~36 MiB at start, ~75-90 MiB after the first round, then flat (glibc keeps
    // the peaks of each worker thread's arena: the 60k-key object parsed and echoed, 1.2 MB
    // messages, a 10,000-call batch). 200 MiB over the start is far above that and far below
    // what keeping each round's payloads, or an allocation that grows with nesting depth or key
    // count, would cost; after the warm-up round, further rounds may add little.
    assert!(
        after.saturating_sub(before) < 200 * MIB,
        "RSS grew from {} MiB to {} MiB",
        before / MIB,
        after / MIB
    );
    assert!(
        after.saturating_sub(after_first) < 48 * MIB,
        "RSS keeps growing round after round: {} MiB after one, {} MiB after {ROUNDS}",
        after_first / MIB,
        after / MIB
    );
    small.stop().await;
    server.stop().await;
}

/// The refusal text goes back to the model (and into the audit log), so it must stay small
/// whatever the model sent. Today one `additionalProperties` violation names every unexpected key:
/// 60,000 keys give ~720 KB of model text.
#[tokio::test]
async fn a_schema_refusal_of_a_huge_object_has_bounded_text() {
    let server = TestServer::start(HOSTILE).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("echo", &many_keys(60_000))).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.refused_by.as_str()),
        (ToolStatus::InvalidArguments, "schema_violation", "schema")
    );
    assert!(
        r.model_text.len() < 16 * 1024,
        "a schema refusal of a 60k-key object is {} bytes of model text: {}…",
        r.model_text.len(),
        r.model_text.chars().take(300).collect::<String>()
    );
    server.stop().await;
}

/// Found by fuzzing (fuzz/fuzz_targets/schema_bind.rs): when the server binds every property of
/// an object, the visible schema drops that object, and an open parent then lets the model send it
/// with keys of its own — which binding merges into what the backend receives, although the tool's
/// schema forbids them there. Here a search filter the server owns gains a model-chosen key.
#[tokio::test]
async fn a_model_cannot_add_keys_to_an_object_the_server_binds() {
    let yaml = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
tools:
  - name: search
    description: Searches within the caller's tenant.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties:
        query: { type: string }
        filter:
          type: object
          properties: { tenant: { type: string } }
          required: [tenant]
          additionalProperties: false
      required: [query, filter]
    bind:
      filter.tenant: "${caller.tenant}"
"#;
    let server = TestServer::start(yaml).await;
    let mut client = server.client().await;
    let r = exec(
        &mut client,
        &who("acme"),
        call("search", r#"{"query":"q","filter":{"tenant_id":"globex"}}"#),
    )
    .await;
    // Refused where the fix put the check — the bind stage validates the arguments again once the
    // bound values are in — naming the key: not just any refusal, which a refusal for another
    // reason would also satisfy.
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.refused_by.as_str()),
        (ToolStatus::InvalidArguments, "schema_violation", "bind"),
        "the backend received {} although the tool's schema allows only filter.tenant: {r:?}",
        r.model_text
    );
    assert!(
        r.error_message
            .contains("once server-bound values are added: /filter:")
            && r.error_message.contains("'tenant_id' was unexpected"),
        "{}",
        r.error_message
    );
    assert_eq!(server.builtins().executions(), 0);
    server.stop().await;
}
