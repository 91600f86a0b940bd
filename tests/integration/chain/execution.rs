//! Stages 10-12 and ExecuteTools: idempotency, deadlines, real cancellation, ordering and caps.

use std::time::Duration;

use futures::future::join_all;
use tonic::Code;
use toolgate::proto::{self, ToolStatus};

use crate::support::{
    Backend, STAGES, TestServer, call, exec, execute_request, on_both_backends, wait_until, who,
};

on_both_backends!(
    an_idempotent_repeat_replays_the_first_result_without_running_again,
    concurrent_duplicates_wait_for_the_first_and_the_tool_runs_once,
);

#[tokio::test]
async fn a_timeout_stops_the_tool_and_says_whether_a_retry_is_safe() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let read = exec(&mut client, &who("acme"), call("slow", r#"{"ms":5000}"#)).await;
    assert_eq!(
        (
            read.status(),
            read.error_type.as_str(),
            read.refused_by.as_str()
        ),
        (ToolStatus::Timeout, "timeout", "execute")
    );
    assert!(read.retryable);
    assert!(
        read.error_message.contains("300 ms"),
        "{}",
        read.error_message
    );
    let write = exec(
        &mut client,
        &who("acme"),
        call("slow_write", r#"{"ms":5000}"#),
    )
    .await;
    assert_eq!(write.status(), ToolStatus::Timeout);
    assert!(
        !write.retryable,
        "a write that timed out must not be blindly retried"
    );
    assert!(
        write.error_message.contains("outcome is unknown"),
        "{}",
        write.error_message
    );
    // Both sleeps were dropped, not left running.
    assert_eq!(*server.builtins().watch_slow_in_flight().borrow(), 0);
    assert_eq!(server.builtins().slow_tasks_finished(), 0);
    server.stop().await;
}

#[tokio::test]
async fn a_client_cancel_really_stops_the_tool_and_is_audited_as_cancelled() {
    let server = TestServer::demo().await;
    let started = server.builtins().watch_executions();
    let mut client = server.client().await;
    let pending = tokio::spawn(async move {
        exec(
            &mut client,
            &who("acme"),
            call("slow_task", r#"{"ms":900}"#),
        )
        .await
    });
    wait_until(started, |n| n >= 1).await;
    pending.abort();
    // The sleep's guard drops when the server drops the call: it ended early, it did not finish.
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 0).await;
    assert_eq!(server.builtins().slow_tasks_finished(), 0);
    let event = server.wait_for_audit(|e| e["tool"] == "slow_task").await;
    assert_eq!(
        (event["status"].as_str(), event["error_type"].as_str()),
        (Some("CANCELLED"), Some("cancelled"))
    );
    server.stop().await;
}

/// A catalog whose `slow` tool allows 30 s, so only the client's deadline can end its calls.
fn patient() -> String {
    let yaml = STAGES.replacen("timeout: 300ms", "timeout: 30s", 1);
    assert_ne!(yaml, STAGES);
    yaml
}

#[tokio::test]
async fn the_client_deadline_bounds_execution() {
    let server = TestServer::start(&patient()).await;
    let mut client = server.client().await;
    let mut request = who("acme").request(execute_request(call("slow", r#"{"ms":20000}"#)));
    // The boundary answers a tenth of the deadline early (at most 250 ms, see DeadlineLayer), so
    // the TIMEOUT result is written before the transport's own timer for the same deadline fires;
    // 2.5 s gives that answer the full 250 ms.
    request.set_timeout(Duration::from_millis(2500));
    let result = client
        .execute_tool(request)
        .await
        .expect("a TIMEOUT result, not a transport error")
        .into_inner()
        .result
        .unwrap();
    assert_eq!(
        (
            result.status(),
            result.error_type.as_str(),
            result.refused_by.as_str()
        ),
        (ToolStatus::Timeout, "timeout", "execute"),
        "{result:?}"
    );
    assert!(
        result.error_message.contains("the client's deadline"),
        "the client's deadline, not the tool's 30 s timeout, ended it: {}",
        result.error_message
    );
    assert!(result.retryable, "slow is read-only");
    let event = server.wait_for_audit(|e| e["tool"] == "slow").await;
    assert_eq!(
        (
            event["status"].as_str(),
            event["error_type"].as_str(),
            event["refused_by"].as_str()
        ),
        (Some("TIMEOUT"), Some("timeout"), Some("execute")),
        "{event}"
    );
    assert!(
        event["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the client's deadline")),
        "{event}"
    );
    // The sleep was dropped at the deadline, not left to run its 20 s.
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 0).await;
    assert_eq!(server.builtins().slow_tasks_finished(), 0);
    server.stop().await;
}

fn batch(
    calls: Vec<proto::ToolCall>,
    parallel: bool,
    max_parallel: u32,
) -> proto::ExecuteToolsRequest {
    proto::ExecuteToolsRequest {
        calls,
        run_id: "run-1".into(),
        step: 3,
        parallel,
        max_parallel,
        catalog_revision: String::new(),
    }
}

async fn run_batch(
    server: &TestServer,
    request: proto::ExecuteToolsRequest,
) -> Vec<proto::ToolResult> {
    let mut client = server.client().await;
    client
        .execute_tools(who("acme").request(request))
        .await
        .unwrap()
        .into_inner()
        .results
}

#[tokio::test]
async fn batch_results_keep_call_order_when_calls_finish_out_of_order() {
    let server = TestServer::start(STAGES).await;
    let calls = vec![
        call("slow", r#"{"ms":150}"#),
        call("", "{}"),
        call("slow", r#"{"ms":10}"#),
        call("echo", r#"{"text":"third"}"#),
        call("slow", r#"{"ms":5000}"#),
    ];
    let results = run_batch(&server, batch(calls, true, 0)).await;
    let summary: Vec<(String, ToolStatus)> = results
        .iter()
        .map(|r| (r.call_id.clone(), r.status()))
        .collect();
    assert_eq!(
        summary,
        [
            ("tool_step_3_0".into(), ToolStatus::Ok),
            ("tool_step_3_1".into(), ToolStatus::InvalidArguments),
            ("tool_step_3_2".into(), ToolStatus::Ok),
            ("tool_step_3_3".into(), ToolStatus::Ok),
            ("tool_step_3_4".into(), ToolStatus::Timeout),
        ]
    );
    assert_eq!(results[0].model_text, r#"{"slept_ms":150}"#);
    assert_eq!(results[3].model_text, "third");
    // The three short sleeps overlapped.
    assert!(server.builtins().slow_max_in_flight() >= 2);
    server.stop().await;
}

#[tokio::test]
async fn the_parallel_cap_is_honoured_and_sequential_means_one_at_a_time() {
    let eight = || {
        (0..8)
            .map(|_| call("slow", r#"{"ms":60}"#))
            .collect::<Vec<_>>()
    };
    let server = TestServer::start(STAGES).await;
    let results = run_batch(&server, batch(eight(), true, 2)).await;
    assert!(results.iter().all(|r| r.status() == ToolStatus::Ok));
    assert_eq!(server.builtins().slow_max_in_flight(), 2);
    server.stop().await;

    // 0 means the server's cap (4 in this catalog); more than the cap is clamped to it.
    for requested in [0, 100] {
        let server = TestServer::start(STAGES).await;
        run_batch(&server, batch(eight(), true, requested)).await;
        assert_eq!(
            server.builtins().slow_max_in_flight(),
            4,
            "max_parallel {requested}"
        );
        server.stop().await;
    }
    let server = TestServer::start(STAGES).await;
    run_batch(&server, batch(eight(), false, 0)).await;
    assert_eq!(server.builtins().slow_max_in_flight(), 1);
    server.stop().await;
}

#[tokio::test]
async fn an_oversized_batch_is_refused_as_a_request_error() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let calls = (0..129).map(|_| call("echo", r#"{"text":"x"}"#)).collect();
    let err = client
        .execute_tools(who("acme").request(batch(calls, true, 0)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("the limit is 128"),
        "{}",
        err.message()
    );
    assert_eq!(server.builtins().executions(), 0);
    server.stop().await;
}

fn keyed(name: &str, args: &str, key: &str) -> proto::ToolCall {
    let mut c = call(name, args);
    c.idempotency_key = key.into();
    c
}

async fn an_idempotent_repeat_replays_the_first_result_without_running_again(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let mut client = server.client().await;
    let first = exec(
        &mut client,
        &who("acme"),
        keyed("greet", r#"{"name":"ada"}"#, "k1"),
    )
    .await;
    let second = exec(
        &mut client,
        &who("acme"),
        keyed("greet", r#"{ "name" : "ada" }"#, "k1"),
    )
    .await;
    assert_eq!(
        (first.status(), first.idempotent_replay),
        (ToolStatus::Ok, false)
    );
    assert_eq!(
        (second.status(), second.idempotent_replay),
        (ToolStatus::Ok, true)
    );
    assert_eq!(second.model_text, first.model_text);
    assert_eq!(server.builtins().executions(), 1);
    let conflict = exec(
        &mut client,
        &who("acme"),
        keyed("greet", r#"{"name":"bob"}"#, "k1"),
    )
    .await;
    assert_eq!(
        (
            conflict.status(),
            conflict.error_type.as_str(),
            conflict.refused_by.as_str()
        ),
        (
            ToolStatus::InvalidArguments,
            "idempotency_conflict",
            "idempotency"
        )
    );
    // Keys are per tenant and per tool.
    assert!(
        !exec(
            &mut client,
            &who("globex"),
            keyed("greet", r#"{"name":"ada"}"#, "k1")
        )
        .await
        .idempotent_replay
    );
    assert!(
        !exec(
            &mut client,
            &who("acme"),
            keyed("half", r#"{"name":"ada"}"#, "k1")
        )
        .await
        .idempotent_replay
    );
    // Past the window the key is fresh again: other arguments under it run (within the window
    // they were a conflict, above). Redis keeps its own time
    // (tests/integration/shared_state/windows.rs covers its window).
    if backend == Backend::Memory {
        server.clock.advance(Duration::from_secs(601));
        let fresh = exec(
            &mut client,
            &who("acme"),
            keyed("greet", r#"{"name":"bob"}"#, "k1"),
        )
        .await;
        assert_eq!(
            (fresh.status(), fresh.idempotent_replay),
            (ToolStatus::Ok, false),
            "{fresh:?}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&fresh.model_text).unwrap(),
            serde_json::json!({"name": "bob"})
        );
    }
    let replays = server
        .audit_events()
        .await
        .iter()
        .filter(|e| e["idempotent_replay"] == true)
        .count();
    assert_eq!(replays, 1);
    server.stop().await;
}

async fn concurrent_duplicates_wait_for_the_first_and_the_tool_runs_once(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let client = server.client().await;
    let results = join_all((0..8).map(|_| {
        let mut client = client.clone();
        async move {
            exec(
                &mut client,
                &who("acme"),
                keyed("slow", r#"{"ms":100}"#, "dup"),
            )
            .await
        }
    }))
    .await;
    assert!(
        results.iter().all(|r| r.status() == ToolStatus::Ok),
        "{results:?}"
    );
    assert_eq!(results.iter().filter(|r| !r.idempotent_replay).count(), 1);
    assert_eq!(server.builtins().slow_tasks_finished(), 1);
    assert_eq!(server.builtins().executions(), 1);
    server.stop().await;
}
