//! Bounded under hostile input (issue 12, items 1–8 and 10): no request can make the sidecar
//! spend unbounded memory or CPU, panic, or mislead. Memory is read from `/proc` of a real binary,
//! with margins far above what the sidecar needs and far below what the defects cost.

use std::{path::Path, time::Duration};

use futures::future::join_all;
use tonic::Code;
use toolgate::proto::{self, ToolStatus};

use crate::support::python;
use crate::{
    support::binary::{Spawned, client, spawn, stop},
    support::{STAGES, TestServer, call, exec, execute_request, http_get, metric, wait_until, who},
};

/// A field of `/proc/PID/status`, in KiB.
pub(crate) fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// CPU seconds (user + system) the process has used.
#[expect(unsafe_code, reason = "sysconf(3) has no safe wrapper")]
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after "(comm) state".
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf only reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(
        per_second > 0,
        "sysconf(_SC_CLK_TCK): {}",
        std::io::Error::last_os_error()
    );
    ticks as f64 / per_second as f64
}

pub(crate) fn serve_file(dir: &Path, yaml: &str) -> Spawned {
    let catalog = dir.join("catalog.yaml");
    std::fs::write(&catalog, yaml).unwrap();
    spawn(&["--config", catalog.to_str().unwrap()])
}

const TYPED: &str = r#"version: 1
identity: { dev_identity: true }
audit: { sink: none }
tenants: { acme: {} }
tools:
  - name: tagged
    description: Takes tags.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { tags: { type: array, items: { type: string } } } }
"#;

/// `{"tags":[1,1,…]}` with `n` numbers where strings are required: `n` violations.
fn wrong_tags(n: usize) -> String {
    let mut text = String::from(r#"{"tags":["#);
    text.push_str(&vec!["1"; n].join(","));
    text.push_str("]}");
    text
}

#[tokio::test]
async fn a_megabyte_of_schema_violations_costs_little_memory_and_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_file(dir.path(), TYPED);
    let pid = server.child.id();
    let mut grpc = client(&server.addr).await;
    exec(
        &mut grpc,
        &who("acme"),
        call("tagged", r#"{"tags":["warm"]}"#),
    )
    .await;
    let (peak_before, cpu_before) = (status_kib(pid, "VmHWM:"), cpu_seconds(pid));
    // Eight at once, as in the report: 520k violations each (over the value limit), and eight
    // within it that still hold 90k violations each.
    let huge = wrong_tags(520_000);
    let many = wrong_tags(90_000);
    let results = join_all((0..16).map(|i| {
        let mut grpc = grpc.clone();
        let args = if i % 2 == 0 {
            huge.clone()
        } else {
            many.clone()
        };
        async move { exec(&mut grpc, &who("acme"), call("tagged", &args)).await }
    }))
    .await;
    for (i, r) in results.iter().enumerate() {
        let expected = if i % 2 == 0 {
            ("arguments_too_large", "structure")
        } else {
            ("schema_violation", "schema")
        };
        assert_eq!(
            (r.error_type.as_str(), r.refused_by.as_str()),
            expected,
            "{}",
            r.error_message
        );
        assert!(r.error_message.len() < 2048, "an unbounded message");
    }
    let grown_mib = (status_kib(pid, "VmHWM:") - peak_before) / 1024;
    let cpu = cpu_seconds(pid) - cpu_before;
    // Before: +509 MiB and ~9 s of CPU for the eight megabyte calls alone.
    assert!(grown_mib < 160, "peak RSS grew by {grown_mib} MiB");
    assert!(cpu < 4.0, "{cpu:.2} s of CPU");
    drop(grpc);
    stop(server).await;
}

#[tokio::test]
async fn what_is_kept_between_calls_stays_within_its_byte_budget() {
    let yaml = r#"version: 1
identity: { dev_identity: true }
audit: { sink: none }
tenants: { acme: {} }
tools:
  - { name: echo, description: Echo., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object, properties: { text: { type: string } } } }
  - { name: approve_me, description: Needs approval., risk_level: write_confirmed, executor: { builtin: echo }, input_schema: { type: object, properties: { text: { type: string } } } }
"#;
    let dir = tempfile::tempdir().unwrap();
    let server = serve_file(dir.path(), yaml);
    let pid = server.child.id();
    let mut grpc = client(&server.addr).await;
    exec(&mut grpc, &who("acme"), call("echo", r#"{"text":"warm"}"#)).await;
    let rss_before = status_kib(pid, "VmRSS:");
    let text = "y".repeat(512 * 1024);
    // 200 keyed calls of half a megabyte each: 100 MiB of results if all were kept.
    for i in 0..200 {
        let mut c = call("echo", &format!(r#"{{"text":"{text}"}}"#));
        c.idempotency_key = format!("k-{i}");
        let r = exec(&mut grpc, &who("acme"), c).await;
        assert_eq!(r.status(), ToolStatus::Ok);
    }
    // And approvals holding a quarter megabyte of arguments each, until the budget says no.
    let quarter = "z".repeat(256 * 1024);
    let mut refused = None;
    for _ in 0..40 {
        let r = exec(
            &mut grpc,
            &who("acme").subject("alice"),
            call("approve_me", &format!(r#"{{"text":"{quarter}"}}"#)),
        )
        .await;
        if r.status() != ToolStatus::ApprovalRequired {
            refused = Some(r);
            break;
        }
    }
    let refused = refused.expect("the approvals budget refused at some point");
    assert_eq!(
        (refused.error_type.as_str(), refused.retryable),
        ("overloaded", true),
        "{refused:?}"
    );
    let (_, page) = http_get(server.admin_addr.parse().unwrap(), "/metrics").await;
    let idempotency = metric(&page, "toolgate_idempotency_bytes", &[]);
    let approvals = metric(&page, "toolgate_approvals_bytes", &[]);
    assert!(
        idempotency > 0.0 && idempotency <= 8.0 * 1048576.0,
        "{idempotency}"
    );
    assert!(
        approvals > 0.0 && approvals <= 4.0 * 1048576.0,
        "{approvals}"
    );
    for gauge in ["toolgate_revision_log_bytes", "toolgate_token_cache_bytes"] {
        assert!(page.contains(gauge), "{gauge} missing from /metrics");
    }
    let grown_mib = (status_kib(pid, "VmRSS:").saturating_sub(rss_before)) / 1024;
    assert!(grown_mib < 64, "RSS grew by {grown_mib} MiB");
    drop(grpc);
    stop(server).await;
}

/// A counting HTTP upstream on loopback: the address, and how many connections it accepted.
async fn counting_upstream() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(socket);
        }
    });
    (port, count)
}

#[tokio::test]
async fn client_identifiers_are_bounded_and_printable() {
    let (port, connections) = counting_upstream().await;
    let catalog = STAGES.replace(
        "tools:\n",
        &format!(
            "upstreams:\n  local: {{ url: \"http://127.0.0.1:{port}/\", allow_schemes: [http], allow_private_addresses: true }}\ntools:\n  - {{ name: remote, description: Remote., risk_level: read_only, executor: {{ http: {{ upstream: local }} }}, input_schema: {{ type: object }} }}\n"
        ),
    );
    let server = TestServer::start(&catalog).await;
    let mut grpc = server.client().await;
    let refused = |r: &proto::ToolResult| (r.status(), r.error_type.clone(), r.refused_by.clone());
    // A control character in the call id once broke every HTTP call as a retryable outage.
    let mut c = call("remote", "{}");
    c.call_id = "call\u{1b}[2J".into();
    let r = exec(&mut grpc, &who("acme"), c).await;
    assert_eq!(
        refused(&r),
        (
            ToolStatus::InvalidArguments,
            "identifier_invalid".into(),
            "structure".into()
        )
    );
    for (field, long) in [("idempotency_key", 0), ("approval_id", 1), ("call_id", 2)] {
        let mut c = call("remote", "{}");
        let value = "k".repeat(300);
        match long {
            0 => c.idempotency_key = value,
            1 => c.approval_id = value,
            _ => c.call_id = value,
        }
        let r = exec(&mut grpc, &who("acme"), c).await;
        assert_eq!(
            refused(&r),
            (
                ToolStatus::InvalidArguments,
                "identifier_too_long".into(),
                "structure".into()
            ),
            "{field}"
        );
        assert!(
            r.call_id.len() <= 256,
            "the refusal echoed an unbounded call id"
        );
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    // Request-level identifiers refuse the request; identities refuse the caller.
    let mut request = execute_request(call("echo", r#"{"text":"x"}"#));
    request.run_id = "r".repeat(300);
    let err = grpc
        .execute_tool(who("acme").request(request))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = grpc
        .list_tools(who(&"t".repeat(300)).request(proto::ListToolsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    server.stop().await;
}

#[tokio::test]
async fn approvals_are_listed_in_pages_of_bounded_previews() {
    let catalog = STAGES
        .replacen(
            "version: 1\n",
            "version: 1\napprovals: { max_bytes_per_tenant: 16777216 }\n",
            1,
        )
        .replace("max_arguments_bytes: 4096", "max_arguments_bytes: 1048576");
    let server = TestServer::start(&catalog).await;
    let mut grpc = server.client().await;
    let alice = who("acme").subject("alice");
    let big = "b".repeat(900 * 1024);
    let mut large = Vec::new();
    for i in 0..6 {
        // Pairs share a millisecond: creation time orders them, then ids within a pair.
        if i % 2 == 0 {
            server.clock.advance(Duration::from_millis(7));
        }
        let r = exec(
            &mut grpc,
            &alice,
            call("approve_me", &format!(r#"{{"order":"{i}{big}"}}"#)),
        )
        .await;
        assert_eq!(
            r.status(),
            ToolStatus::ApprovalRequired,
            "{}",
            r.error_message
        );
        large.push(r.approval_id);
    }
    let legit = exec(
        &mut grpc,
        &alice,
        call("approve_me", r#"{"order":"o-1","amount":5}"#),
    )
    .await
    .approval_id;
    let bob = who("acme").subject("bob").scopes("toolgate:approve");
    let mut approvals = server.approvals().await;
    let all = approvals
        .list_approvals(bob.request(proto::ListApprovalsRequest::default()))
        .await
        .expect("six large approvals no longer hide the list")
        .into_inner();
    assert_eq!(all.approvals.len(), 7);
    assert!(all.next_page_token.is_empty());
    // Oldest first, ties by id: the order the listing promises, computed here from the
    // approvals' own fields.
    let listed: Vec<(i64, String)> = all
        .approvals
        .iter()
        .map(|a| (a.created_at_unix_ms, a.approval_id.clone()))
        .collect();
    let mut by_creation = listed.clone();
    by_creation.sort();
    assert_eq!(listed, by_creation);
    let times: std::collections::BTreeSet<i64> = listed.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        times.len(),
        3,
        "three creation times, each shared by two or more"
    );
    assert!(all.approvals.iter().any(|a| a.approval_id == legit));
    for a in &all.approvals {
        assert!(a.arguments_preview.len() <= 1024 && a.arguments_json.is_empty());
        assert_eq!(a.arguments_truncated, a.approval_id != legit);
    }
    // Two at a time: the pages add up to the whole list, in the same order (oldest first, ties
    // within a millisecond by id).
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = approvals
            .list_approvals(bob.request(proto::ListApprovalsRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(page.approvals.len() <= 2);
        seen.extend(page.approvals.into_iter().map(|a| a.approval_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let expected: Vec<String> = all
        .approvals
        .iter()
        .map(|a| a.approval_id.clone())
        .collect();
    assert_eq!(seen, expected);
    // The full arguments of one, on request.
    let full = approvals
        .get_approval(bob.request(proto::GetApprovalRequest {
            approval_id: large[0].clone(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert!(full.arguments_json.len() > 900 * 1024);
    let err = approvals
        .list_approvals(bob.request(proto::ListApprovalsRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test]
async fn a_batch_returns_what_fits_and_refuses_each_result_that_does_not() {
    let catalog = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\ntools:\n  - name: print\n    description: Prints n bytes.\n    risk_level: read_only\n    input_schema: {{ type: object, properties: {{ n: {{ type: integer }} }} }}\n    executor:\n      process:\n        command: {}\n        args: [\"-c\", \"import json,sys; sys.stdout.write('x' * json.load(sys.stdin)['n'])\"]\n        env: [PATH]\n",
        python()
    );
    let env =
        toolgate::settings::Env::default().with("PATH", &std::env::var("PATH").unwrap_or_default());
    let server = TestServer::start_with_env(&catalog, &env).await;
    let mut grpc = server.client().await;
    let calls: Vec<proto::ToolCall> = (0..5)
        .map(|i| {
            let mut c = call("print", r#"{"n":1000000}"#);
            c.call_id = format!("big-{i}");
            c
        })
        .collect();
    let results = grpc
        .execute_tools(who("acme").request(proto::ExecuteToolsRequest {
            calls,
            run_id: "r".into(),
            ..Default::default()
        }))
        .await
        .expect("the batch answers even though its outputs do not all fit")
        .into_inner()
        .results;
    let statuses: Vec<(ToolStatus, String)> = results
        .iter()
        .map(|r| (r.status(), r.error_type.clone()))
        .collect();
    let ok = statuses.iter().filter(|s| s.0 == ToolStatus::Ok).count();
    assert!((3..5).contains(&ok), "{statuses:?}");
    for r in &results {
        #[expect(
            deprecated,
            reason = "the test checks the deprecated field stays empty"
        )]
        let output = &r.output;
        assert!(output.is_empty(), "an output travelled twice");
        match r.status() {
            ToolStatus::Ok => assert_eq!(r.model_text.len(), 1_000_000),
            _ => assert_eq!(
                (r.error_type.as_str(), r.refused_by.as_str()),
                ("output_too_large", "result")
            ),
        }
    }
    // The audit says what the client got.
    for r in results.iter().filter(|r| r.status() != ToolStatus::Ok) {
        let event = server
            .wait_for_audit(|e| e["call_id"] == r.call_id.as_str())
            .await;
        assert_eq!(event["error_type"], "output_too_large");
    }
    server.stop().await;
}

const WAITING: &str = r#"version: 1
identity: { dev_identity: true }
limits: { max_in_flight: 2, max_streams_per_connection: 2 }
tenants: { acme: {} }
tools:
  - { name: wait, description: Waits., risk_level: read_only, timeout: 30s, executor: { builtin: slow_task }, input_schema: { type: object, properties: { ms: { type: integer } } } }
"#;

#[tokio::test]
async fn calls_beyond_the_in_flight_cap_are_refused_at_once_and_probes_still_answer() {
    let server = TestServer::start(WAITING).await;
    // Two clients on two connections hold both slots.
    let held = tokio::spawn({
        let channel = (server.client().await, server.client().await);
        async move {
            let (mut a, mut b) = channel;
            let acme = who("acme");
            tokio::join!(
                exec(&mut a, &acme, call("wait", r#"{"ms":30000}"#)),
                exec(&mut b, &acme, call("wait", r#"{"ms":30000}"#))
            )
        }
    });
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 2).await;
    let mut third = server.client().await;
    let err = third
        .execute_tool(who("acme").request(execute_request(call("wait", r#"{"ms":1}"#))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("probes are never refused")
        .into_inner();
    assert_eq!(
        serving.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    held.abort();
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn one_connection_runs_at_most_its_stream_cap_at_once() {
    let server =
        TestServer::start(&WAITING.replace("max_in_flight: 2,", "max_in_flight: 64,")).await;
    let grpc = server.client().await;
    // Six calls on one connection whose cap is two: the server never runs more than two of them
    // at once; a stream over the cap is refused at once (REFUSED_STREAM, which clients see as a
    // retryable UNAVAILABLE) or waits in the client for a free stream.
    let results = join_all((0..6).map(|_| {
        let mut grpc = grpc.clone();
        async move {
            grpc.execute_tool(who("acme").request(execute_request(call("wait", r#"{"ms":200}"#))))
                .await
        }
    }))
    .await;
    let mut ran = 0;
    for result in &results {
        match result {
            Ok(response) => {
                assert_eq!(
                    response.get_ref().result.as_ref().unwrap().status(),
                    ToolStatus::Ok
                );
                ran += 1;
            }
            Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        }
    }
    assert!(ran >= 2, "{results:?}");
    assert_eq!(server.builtins().slow_max_in_flight(), 2);
    server.stop().await;
}

#[tokio::test]
async fn an_absurd_grpc_timeout_is_read_as_no_deadline_not_a_panic() {
    let server = TestServer::start(STAGES).await;
    let mut grpc = server.client().await;
    for value in ["18446744073709551615S", "99999999H"] {
        let mut request = who("acme").request(execute_request(call("echo", r#"{"text":"x"}"#)));
        request
            .metadata_mut()
            .insert("grpc-timeout", value.parse().unwrap());
        let r = grpc
            .execute_tool(request)
            .await
            .unwrap_or_else(|e| panic!("grpc-timeout {value}: {e:?}"))
            .into_inner()
            .result
            .unwrap();
        assert_eq!(r.model_text, "x");
    }
    server.stop().await;
}
