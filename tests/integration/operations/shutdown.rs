//! Graceful shutdown of the real binary (docs/operations.md, "Draining and shutting down"): on
//! SIGTERM it stops accepting, `/readyz` answers 503 while it drains, calls that finish within
//! `server.shutdown_grace` are answered, calls still running at the end of the grace period end
//! CANCELLED with their audit events written, and it exits 0.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use serde_json::Value;
use tonic::{Code, transport::Endpoint};
use toolgate::proto::{ToolStatus, tool_gate_client::ToolGateClient};

use crate::{
    support::binary::{sigterm, spawn, wait_exit},
    support::{call, execute_request, http_get, who},
};

/// The demo, with audit to `audit` and a 2 s grace period; slow_task may run a minute.
fn catalog(audit: &std::path::Path) -> String {
    let yaml = toolgate::settings::DEMO_CATALOG
        .replace(
            "audit:\n  sink: stdout\n",
            &format!("audit:\n  sink: file\n  path: {}\n", audit.display()),
        )
        .replace("shutdown_grace: 10s", "shutdown_grace: 2s")
        .replace("timeout: 1000ms", "timeout: 60s");
    assert!(yaml.contains("sink: file") && yaml.contains("shutdown_grace: 2s"));
    assert!(yaml.contains("timeout: 60s"));
    yaml
}

async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 10s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_refuses_new_calls_reports_not_ready_and_cancels_what_outlives_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, catalog(&audit)).unwrap();
    let spawned = spawn(&["--config", config.to_str().unwrap()]);
    let addr: SocketAddr = spawned.addr.parse().unwrap();
    let admin: SocketAddr = spawned.admin_addr.parse().unwrap();
    assert_eq!(http_get(admin, "/readyz").await.0, 200);

    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // One call that ends within the grace period, two that outlive it.
    let calls: Vec<_> = [("finishes", 1500), ("held-0", 30_000), ("held-1", 30_000)]
        .into_iter()
        .map(|(id, ms)| {
            let mut client = ToolGateClient::new(channel.clone());
            tokio::spawn(async move {
                let mut c = call("slow_task", &format!(r#"{{"ms":{ms}}}"#));
                c.call_id = id.into();
                let answer = client
                    .execute_tool(who("acme").request(execute_request(c)))
                    .await
                    .map(|r| r.into_inner().result.expect("a result"));
                (id, answer)
            })
        })
        .collect();
    drop(channel);
    let spawned = tokio::task::spawn_blocking(move || {
        spawned.wait_for_log("executing", 3);
        spawned
    })
    .await
    .unwrap();
    sigterm(&spawned.child);

    // Draining: not ready, and new calls refused, while the calls are still running.
    until("/readyz to answer 503", || async {
        http_get(admin, "/readyz").await.0 == 503
    })
    .await;
    assert_eq!(
        http_get(admin, "/healthz").await.0,
        200,
        "the process is up"
    );
    let mut late = ToolGateClient::new(
        Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy(),
    );
    let refused = late
        .execute_tool(who("acme").request(execute_request(call("echo", r#"{"text":"late"}"#))))
        .await
        .expect_err("a call while draining");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        calls.iter().all(|c| !c.is_finished()),
        "the calls were still running while the server drained"
    );

    let mut answers = BTreeMap::new();
    for handle in calls {
        let (id, answer) = tokio::time::timeout(Duration::from_secs(20), handle)
            .await
            .expect("every call is answered or cut off")
            .unwrap();
        answers.insert(id, answer);
    }
    let (status, logs) = tokio::task::spawn_blocking(move || {
        let mut spawned = spawned;
        (wait_exit(&mut spawned.child), spawned.logs())
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(0), "{logs}");
    assert!(
        logs.contains("grace period over; cancelling calls still in flight"),
        "{logs}"
    );
    let finished = answers["finishes"].as_ref().expect("answered");
    assert_eq!(finished.status(), ToolStatus::Ok, "{finished:?}");
    // The calls still running when the grace ended were cancelled: they answer CANCELLED (or,
    // if the connection closed first, fail as a transport error), never OK.
    for id in ["held-0", "held-1"] {
        match &answers[id] {
            Ok(result) => assert_eq!(
                (
                    result.status(),
                    result.error_type.as_str(),
                    result.error_message.as_str()
                ),
                (
                    ToolStatus::Cancelled,
                    "cancelled",
                    "the sidecar is shutting down"
                ),
                "{id}: {result:?}"
            ),
            Err(status) => assert!(
                matches!(
                    status.code(),
                    Code::Cancelled | Code::Unavailable | Code::Unknown
                ),
                "{id}: {status:?}"
            ),
        }
    }
    // Each call has exactly one event; those cut off at the end of the grace say CANCELLED.
    let events: BTreeMap<String, Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| {
            let e: Value = serde_json::from_str(l).unwrap();
            (e["call_id"].as_str().unwrap().to_owned(), e)
        })
        .collect();
    assert_eq!(
        events.keys().map(String::as_str).collect::<Vec<_>>(),
        ["finishes", "held-0", "held-1"]
    );
    assert_eq!(events["finishes"]["status"], "OK");
    for id in ["held-0", "held-1"] {
        assert_eq!(
            (
                events[id]["status"].as_str(),
                events[id]["error_type"].as_str(),
                events[id]["refused_by"].as_str()
            ),
            (Some("CANCELLED"), Some("cancelled"), Some("execute")),
            "{}",
            events[id]
        );
    }
}

/// docs/operations.md: `UNAVAILABLE` while shutting down, also for a client whose connection was
/// open before SIGTERM: the sidecar keeps its connections while it drains and answers their new
/// calls UNAVAILABLE itself (a GOAWAY would make tonic fail the next call as CANCELLED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_draining_connection_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, catalog(&audit)).unwrap();
    let spawned = spawn(&["--config", config.to_str().unwrap()]);
    let channel = Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let running = {
        let mut client = ToolGateClient::new(channel.clone());
        tokio::spawn(async move {
            client
                .execute_tool(
                    who("acme").request(execute_request(call("slow_task", r#"{"ms":1500}"#))),
                )
                .await
        })
    };
    let spawned = tokio::task::spawn_blocking(move || {
        spawned.wait_for_log("executing", 1);
        spawned
    })
    .await
    .unwrap();
    sigterm(&spawned.child);
    let admin: SocketAddr = spawned.admin_addr.parse().unwrap();
    until("/readyz to answer 503", || async {
        http_get(admin, "/readyz").await.0 == 503
    })
    .await;
    let refused = ToolGateClient::new(channel)
        .execute_tool(who("acme").request(execute_request(call("echo", r#"{"text":"late"}"#))))
        .await
        .expect_err("a call while draining");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(running.await.unwrap().is_ok());
    let mut spawned = spawned;
    assert_eq!(wait_exit(&mut spawned.child).code(), Some(0));
}
