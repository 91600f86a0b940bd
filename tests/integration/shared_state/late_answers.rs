//! What the shared state does with an operation the sidecar gave up on (issue 25, item 2), and
//! with claims whose sidecar went silent (issue 27, item 8): real sidecars, a real
//! redis-server paused with `CLIENT PAUSE` (its clients' commands wait, and run when it ends)
//! or a sidecar killed with SIGKILL mid-call.
//!
//! A command sent before the timeout fired still reaches Redis; these tests let it run after the
//! pause and then look at what it left: nothing, since the script saw that its sidecar had given
//! up. Every wait is a bounded poll.

use std::time::{Duration, Instant};

use futures::future::join_all;
use toolgate::proto::{self, ToolStatus};

use crate::support::info_text;
use crate::{
    shared_state::{Bank, keyed, tools},
    support::binary::{Spawned, spawn},
    support::{RedisServer, TestServer, call, exec, execute_request, who},
};

/// Sidecars on one Redis with a short operation timeout: a keyed write, a quota of one a
/// minute, a quota that never runs out, and a keyed read-only call and write at a bank that
/// holds requests while its gate is closed.
fn catalog(redis: &str, bank: std::net::SocketAddr, limits: &str) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
state:
  backend: redis
  redis: {{ url: "{redis}", timeout: 200ms }}
limits: {{ {limits} }}
audit: {{ sink: none }}
tenants: {{ acme: {{}}, globex: {{}} }}
upstreams:
  bank: {{ url: "http://{bank}/pay", allow_schemes: [http], allow_private_addresses: true }}
tools:
  - {{ name: note, description: Notes., risk_level: write_draft, timeout: 1s, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: sign, description: Signs once approved., risk_level: write_confirmed, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: once, description: Once a minute., risk_level: read_only, rate_limit: 1/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: often, description: Plenty., risk_level: read_only, rate_limit: 1000/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: look, description: Reads at the bank., risk_level: read_only, timeout: 2s, executor: {{ http: {{ upstream: bank }} }}, input_schema: {{ type: object }} }}
  - {{ name: charge, description: Charges at the bank., risk_level: write_draft, timeout: 2s, executor: {{ http: {{ upstream: bank }} }}, input_schema: {{ type: object }} }}
"#
    )
}

/// The in-process sidecar of the pause tests (the bank is never called there).
async fn sidecar(redis: &RedisServer, limits: &str) -> TestServer {
    let yaml = catalog(&redis.url(), "127.0.0.1:9".parse().unwrap(), limits)
        .replace("audit: { sink: none }\n", "");
    TestServer::start(&yaml).await
}

/// EVALSHA calls Redis has counted (run or refused), from `INFO commandstats`.
async fn scripts_seen(redis: &RedisServer) -> u64 {
    let info = info_text(redis.command(&["INFO", "commandstats"]).await);
    let Some(line) = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
    else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    field("calls") + field("rejected_calls")
}

/// Pauses every client of `redis` (the sidecar's connections and ours) for `ms`.
async fn pause(redis: &RedisServer, ms: u64) {
    let paused = redis
        .command(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"])
        .await;
    assert_eq!(paused, redis::Value::Okay);
}

/// Waits until the pause is over and Redis has run at least `count` scripts since `before`:
/// the commands the sidecar sent during the pause have all been run by then (our PING, sent
/// after them, is answered after them).
async fn after_the_pause(redis: &RedisServer, before: u64, count: u64) {
    assert_eq!(
        redis
            .command_within(&["PING"], Duration::from_secs(15))
            .await,
        redis::Value::SimpleString("PONG".into())
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while scripts_seen(redis).await < before + count {
        assert!(
            Instant::now() < deadline,
            "Redis never ran the {count} queued scripts"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Idempotency entries of `tenant` still marked running.
async fn running_claims(redis: &RedisServer, tenant: &str) -> usize {
    let pattern = format!("toolgate:{{{tenant}}}:idem:[0-9a-f]*");
    let keys = match redis.command(&["KEYS", &pattern]).await {
        redis::Value::Array(keys) => keys,
        other => panic!("KEYS answered {other:?}"),
    };
    let mut running = 0;
    for key in keys {
        let redis::Value::BulkString(key) = key else {
            panic!("{key:?}")
        };
        let key = String::from_utf8(key).unwrap();
        let state = redis.command(&["HGET", &key, "state"]).await;
        if state == redis::Value::BulkString(b"running".to_vec()) {
            running += 1;
        }
    }
    running
}

fn refused_by_the_state(result: &proto::ToolResult, stage: &str) {
    assert_eq!(
        (
            result.status(),
            result.error_type.as_str(),
            result.refused_by.as_str(),
            result.retryable
        ),
        (ToolStatus::Unavailable, "state_unavailable", stage, true),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_keyed_write_refused_during_a_pause_runs_when_retried_after_it() {
    let redis = RedisServer::start();
    let server = sidecar(&redis, "").await;
    let mut client = server.client().await;
    let alice = who("acme");
    // Scripts loaded and Redis's clock sampled before the pause.
    let warm = exec(&mut client, &alice, keyed("note", "{}", "warm")).await;
    assert_eq!(warm.status(), ToolStatus::Ok, "{warm:?}");
    let before = scripts_seen(&redis).await;
    let ran = server.builtins().executions();
    pause(&redis, 1500).await;
    let refused = exec(&mut client, &alice, keyed("note", r#"{"n":1}"#, "k1")).await;
    refused_by_the_state(&refused, "idempotency");
    assert!(refused.error_message.contains("not run"), "{refused:?}");
    after_the_pause(&redis, before, 1).await;
    // The claim sent during the pause did nothing when Redis got to it.
    assert_eq!(running_claims(&redis, "acme").await, 0);
    let retried = exec(&mut client, &alice, keyed("note", r#"{"n":1}"#, "k1")).await;
    assert_eq!(
        (retried.status(), retried.idempotent_replay),
        (ToolStatus::Ok, false),
        "{retried:?}"
    );
    assert_eq!(
        server.builtins().executions(),
        ran + 1,
        "the retry ran once"
    );
    let again = exec(&mut client, &alice, keyed("note", r#"{"n":1}"#, "k1")).await;
    assert_eq!(
        (again.status(), again.idempotent_replay),
        (ToolStatus::Ok, true),
        "{again:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_quota_is_not_used_by_a_call_refused_during_a_pause() {
    let redis = RedisServer::start();
    let server = sidecar(&redis, "").await;
    let mut client = server.client().await;
    let alice = who("acme");
    let warm = exec(&mut client, &alice, call("often", "{}")).await;
    assert_eq!(warm.status(), ToolStatus::Ok, "{warm:?}");
    let before = scripts_seen(&redis).await;
    pause(&redis, 1500).await;
    let refused = exec(&mut client, &alice, call("once", "{}")).await;
    refused_by_the_state(&refused, "rate_limit");
    after_the_pause(&redis, before, 1).await;
    // The quota's one call a minute is still there, and then used.
    let first = exec(&mut client, &alice, call("once", "{}")).await;
    assert_eq!(first.status(), ToolStatus::Ok, "{first:?}");
    let second = exec(&mut client, &alice, call("once", "{}")).await;
    assert_eq!(second.status(), ToolStatus::RateLimited, "{second:?}");
    server.stop().await;
}

#[tokio::test]
async fn an_approval_request_refused_during_a_pause_leaves_no_approval_behind() {
    let redis = RedisServer::start();
    let server = sidecar(&redis, "").await;
    let mut client = server.client().await;
    let warm = exec(&mut client, &who("acme"), call("sign", r#"{"n":0}"#)).await;
    assert_eq!(warm.status(), ToolStatus::ApprovalRequired, "{warm:?}");
    let before = scripts_seen(&redis).await;
    pause(&redis, 1500).await;
    let refused = exec(&mut client, &who("acme"), call("sign", r#"{"n":1}"#)).await;
    refused_by_the_state(&refused, "approval");
    after_the_pause(&redis, before, 1).await;
    // Only the approval asked for before the pause is waiting for an approver: none was made
    // for a request its caller was told had failed.
    let listed = server
        .approvals()
        .await
        .list_approvals(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::ListApprovalsRequest::default()),
        )
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(
        listed.iter().map(|a| &a.approval_id).collect::<Vec<_>>(),
        [&warm.approval_id]
    );
    server.stop().await;
}

#[tokio::test]
async fn keyed_calls_refused_during_a_pause_leave_no_claims_to_hold_the_tenants_budget() {
    let redis = RedisServer::start();
    let server = sidecar(&redis, "idempotency_max_entries_per_tenant: 8").await;
    let mut client = server.client().await;
    let warm = exec(&mut client, &who("acme"), keyed("note", "{}", "warm")).await;
    assert_eq!(warm.status(), ToolStatus::Ok, "{warm:?}");
    let before = scripts_seen(&redis).await;
    pause(&redis, 3000).await;
    let refused = join_all((0..40).map(|i| {
        let mut client = client.clone();
        async move {
            exec(
                &mut client,
                &who("acme"),
                keyed("note", "{}", &format!("paused-{i}")),
            )
            .await
        }
    }))
    .await;
    for result in &refused {
        refused_by_the_state(result, "idempotency");
    }
    after_the_pause(&redis, before, 40).await;
    assert_eq!(running_claims(&redis, "acme").await, 0);
    // The tenant's budget of 8 keys is free for new ones.
    for i in 0..8 {
        let fresh = exec(
            &mut client,
            &who("acme"),
            keyed("note", "{}", &format!("after-{i}")),
        )
        .await;
        assert_eq!(fresh.status(), ToolStatus::Ok, "{fresh:?}");
    }
    server.stop().await;
}

/// Writes `yaml` into a directory of its own and starts a sidecar on it.
fn spawn_on(dir: &std::path::Path, yaml: &str) -> Spawned {
    let path = dir.join("catalog.yaml");
    std::fs::write(&path, yaml).unwrap();
    spawn(&["--config", &path.display().to_string()])
}

/// Starts `calls` on `sidecar` and waits (bounded) until `bank` holds `arrived` requests.
async fn held_at_the_bank(
    sidecar: &Spawned,
    bank: &Bank,
    calls: Vec<proto::ToolCall>,
    arrived: usize,
) -> Vec<tokio::task::JoinHandle<Result<tonic::Response<proto::ExecuteToolResponse>, tonic::Status>>>
{
    bank.gate.send_replace(false);
    let mut handles = Vec::new();
    for c in calls {
        let mut client = tools(sidecar).await;
        handles.push(tokio::spawn(async move {
            client
                .execute_tool(who("acme").request(execute_request(c)))
                .await
        }));
    }
    let mut seen = bank.arrived.clone();
    tokio::time::timeout(Duration::from_secs(10), seen.wait_for(|n| *n >= arrived))
        .await
        .expect("the calls reach the bank")
        .unwrap();
    handles
}

/// Kills a sidecar at once (SIGKILL): no goodbye to Redis, its claims stay as they are.
fn kill(mut sidecar: Spawned) {
    sidecar.child.kill().unwrap();
    sidecar.child.wait().unwrap();
}

#[tokio::test]
async fn claims_whose_lease_has_passed_no_longer_hold_the_tenants_budget() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = catalog(
        &redis.url(),
        bank.addr,
        "idempotency_max_entries_per_tenant: 2",
    )
    .replace("timeout: 200ms", "timeout: 5s")
    // A lease of 4 s + 5 s: far longer than the second sidecar takes to start.
    .replace(
        "risk_level: read_only, timeout: 2s",
        "risk_level: read_only, timeout: 4s",
    );
    let first = spawn_on(dir.path(), &yaml);
    // Two read-only keyed calls are running at the bank when their sidecar dies.
    let calls = vec![keyed("look", "{}", "r1"), keyed("look", "{}", "r2")];
    let _held = held_at_the_bank(&first, &bank, calls, 2).await;
    kill(first);
    let second = spawn_on(dir.path(), &yaml);
    let mut client = tools(&second).await;
    // Their claims hold the tenant's two keys while their lease lasts (the tool's 4 s timeout
    // plus 5 s), then free them: a new key is claimed without waiting for the 10 min window.
    let full = exec(&mut client, &who("acme"), keyed("often", "{}", "new")).await;
    assert_eq!(
        (full.status(), full.error_type.as_str()),
        (ToolStatus::Unavailable, "overloaded"),
        "{full:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fresh = exec(&mut client, &who("acme"), keyed("often", "{}", "new")).await;
        if fresh.status() == ToolStatus::Ok {
            break;
        }
        assert_eq!(fresh.error_type, "overloaded", "{fresh:?}");
        assert!(
            Instant::now() < deadline,
            "the silent sidecar's claims still hold the budget"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bank.gate.send_replace(true);
}

#[tokio::test]
async fn after_a_killed_sidecars_lease_a_read_is_claimed_anew_and_a_write_is_outcome_unknown() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = catalog(&redis.url(), bank.addr, "").replace("timeout: 200ms", "timeout: 5s");
    let first = spawn_on(dir.path(), &yaml);
    let calls = vec![
        keyed("look", r#"{"q":1}"#, "read-1"),
        keyed("charge", r#"{"amount":5}"#, "write-1"),
    ];
    let _held = held_at_the_bank(&first, &bank, calls, 2).await;
    kill(first);
    bank.gate.send_replace(true);
    let second = spawn_on(dir.path(), &yaml);
    let mut client = tools(&second).await;
    // While the lease lasts, the write's key is still the dead sidecar's.
    let mut impatient = who("acme").request(execute_request(keyed(
        "charge",
        r#"{"amount":5}"#,
        "write-1",
    )));
    impatient.set_timeout(Duration::from_millis(500));
    let busy = client
        .execute_tool(impatient)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(busy.error_type, "idempotency_in_progress", "{busy:?}");
    // After it, the write is kept as "outcome unknown": it may have run, so it never runs again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let unknown = loop {
        let mut request = who("acme").request(execute_request(keyed(
            "charge",
            r#"{"amount":5}"#,
            "write-1",
        )));
        request.set_timeout(Duration::from_millis(500));
        let result = client
            .execute_tool(request)
            .await
            .unwrap()
            .into_inner()
            .result
            .unwrap();
        if result.error_type != "idempotency_in_progress" {
            break result;
        }
        assert!(Instant::now() < deadline, "the lease never ended");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (
            unknown.status(),
            unknown.error_type.as_str(),
            unknown.idempotent_replay,
            unknown.retryable
        ),
        (ToolStatus::Cancelled, "cancelled", true, false),
        "{unknown:?}"
    );
    assert!(
        unknown.error_message.contains("outcome is unknown"),
        "{unknown:?}"
    );
    // The read is claimed anew and runs: the bank sees it a second time, and the write never
    // again.
    let read = exec(
        &mut client,
        &who("acme"),
        keyed("look", r#"{"q":1}"#, "read-1"),
    )
    .await;
    assert_eq!(
        (read.status(), read.idempotent_replay),
        (ToolStatus::Ok, false),
        "{read:?}"
    );
    assert_eq!(*bank.arrived.borrow(), 3, "the read ran anew, and only it");
}
