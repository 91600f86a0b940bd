//! State shared through Redis (issue 13): real `toolgate` binaries sharing one real
//! redis-server on loopback — quotas exact across sidecars, an approval created on one, decided
//! on another and redeemed once on a third, idempotent duplicates run once across sidecars and
//! restarts — and the outage behaviour: Redis killed, restarted, paused, its scripts flushed.
//! Backends that run a tool are counted at a real HTTP upstream every sidecar calls.

pub(crate) mod approvals_at_scale;
pub(crate) mod late_answers;
pub(crate) mod refusals;
pub(crate) mod secrets;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::future::join_all;
use tokio::sync::watch;
use tonic::transport::Channel;
use toolgate::proto::{
    self, ApprovalDecision, ToolStatus, approvals_client::ApprovalsClient,
    tool_gate_client::ToolGateClient,
};

use crate::support::{APPROVE, alice, bob};
use crate::{
    support::binary::{Spawned, spawn, spawn_with_env, stop},
    support::{
        Backend, RedisServer, TestServer, Who, call, exec, execute_request, http_get, metric,
        on_both_backends, redis_state, who,
    },
};

/// An HTTP upstream every sidecar calls: it counts the requests that reached it, and holds them
/// while its gate is closed.
pub(crate) struct Bank {
    pub(crate) addr: std::net::SocketAddr,
    paid: Arc<AtomicUsize>,
    pub(crate) arrived: watch::Receiver<usize>,
    pub(crate) gate: watch::Sender<bool>,
}

impl Bank {
    pub(crate) async fn open() -> Bank {
        let paid = Arc::new(AtomicUsize::new(0));
        let (arrived_tx, arrived) = watch::channel(0usize);
        let (gate, gate_rx) = watch::channel(true);
        let counter = paid.clone();
        let arrived_tx = Arc::new(arrived_tx);
        let app = axum::Router::new().route(
            "/pay",
            axum::routing::post(move || {
                let counter = counter.clone();
                let arrived = arrived_tx.clone();
                let mut gate = gate_rx.clone();
                async move {
                    arrived.send_modify(|n| *n += 1);
                    let _ = gate.wait_for(|open| *open).await;
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    format!(r#"{{"payment":{n}}}"#)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Bank {
            addr,
            paid,
            arrived,
            gate,
        }
    }

    pub(crate) fn paid(&self) -> usize {
        self.paid.load(Ordering::SeqCst)
    }
}

/// The catalog the sidecars share: a quota, an approval-needing payment, a keyed charge and a
/// tool that needs no state at all.
fn catalog(redis: &str, bank: std::net::SocketAddr, extra_state: &str) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
{state}{extra_state}audit: {{ sink: none }}
approvals: {{ ttl: 5m }}
tenants: {{ acme: {{}}, globex: {{}} }}
upstreams:
  bank: {{ url: "http://{bank}/pay", allow_schemes: [http], allow_private_addresses: true }}
tools:
  - {{ name: limited, description: Five a minute., risk_level: read_only, rate_limit: 5/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: pay, description: Pays once approved., risk_level: write_confirmed, executor: {{ http: {{ upstream: bank }} }}, input_schema: {{ type: object, properties: {{ amount: {{ type: integer }} }} }} }}
  - {{ name: charge, description: Charges., risk_level: write_draft, executor: {{ http: {{ upstream: bank }} }}, input_schema: {{ type: object, properties: {{ amount: {{ type: integer }} }} }} }}
  - {{ name: free, description: Needs no shared state., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object, properties: {{ text: {{ type: string }} }} }} }}
"#,
        state = redis_state(redis),
    )
}

/// The catalog for an in-process [`TestServer`], which brings its own audit file.
fn in_process(redis: &str, extra_state: &str) -> String {
    catalog(redis, "127.0.0.1:9".parse().unwrap(), extra_state)
        .replace("audit: { sink: none }\n", "")
}

/// Writes `yaml` into `dir` and starts `n` sidecars on it.
fn sidecars(dir: &std::path::Path, yaml: &str, n: usize) -> Vec<Spawned> {
    let path = dir.join("catalog.yaml");
    std::fs::write(&path, yaml).unwrap();
    let path = path.display().to_string();
    (0..n).map(|_| spawn(&["--config", &path])).collect()
}

pub(crate) async fn connect(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

pub(crate) async fn tools(sidecar: &Spawned) -> ToolGateClient<Channel> {
    ToolGateClient::new(connect(&sidecar.addr).await)
}

async fn approvals(sidecar: &Spawned) -> ApprovalsClient<Channel> {
    ApprovalsClient::new(connect(&sidecar.addr).await)
}

pub(crate) fn keyed(tool: &str, args: &str, key: &str) -> proto::ToolCall {
    let mut c = call(tool, args);
    c.idempotency_key = key.into();
    c
}

fn redeeming(args: &str, approval_id: &str) -> proto::ToolCall {
    let mut c = call("pay", args);
    c.approval_id = approval_id.into();
    c
}

#[tokio::test]
async fn three_sidecars_with_30_callers_each_admit_exactly_the_quota() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let sidecars = sidecars(dir.path(), &catalog(&redis.url(), bank.addr, ""), 3);
    // 90 callers, each on a connection of its own, all at once.
    let mut callers = Vec::new();
    for sidecar in &sidecars {
        for _ in 0..30 {
            callers.push(tools(sidecar).await);
        }
    }
    let results = join_all(callers.into_iter().map(|mut client| async move {
        exec(&mut client, &who("acme"), call("limited", "{}")).await
    }))
    .await;
    let admitted = results
        .iter()
        .filter(|r| r.status() == ToolStatus::Ok)
        .count();
    let limited: Vec<u64> = results
        .iter()
        .filter(|r| r.status() == ToolStatus::RateLimited)
        .map(|r| r.retry_after_ms)
        .collect();
    let statuses: Vec<_> = results.iter().map(|r| r.status()).collect();
    assert_eq!((admitted, limited.len()), (5, 85), "{statuses:?}");
    // The wait comes from the script: at most one emission (12 s) away, never nothing.
    assert!(
        limited.iter().all(|&ms| ms > 0 && ms <= 12_000),
        "{limited:?}"
    );
    // Another tenant's quota is its own, on any sidecar.
    let mut client = tools(&sidecars[2]).await;
    assert_eq!(
        exec(&mut client, &who("globex"), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    // The keys carry the tenant as hash tag and expire when idle.
    let ttl = redis
        .command(&["PTTL", "toolgate:{acme}:rl:tool:limited:5/60s/5"])
        .await;
    assert!(
        matches!(ttl, redis::Value::Int(ms) if ms > 0 && ms <= 60_000),
        "{ttl:?}"
    );
}

#[tokio::test]
async fn an_approval_created_on_a_is_decided_on_b_and_redeemed_once_on_c() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let sidecars = sidecars(dir.path(), &catalog(&redis.url(), bank.addr, ""), 3);
    let (a, b, c) = (&sidecars[0], &sidecars[1], &sidecars[2]);
    let args = r#"{"amount":250}"#;
    let requested = exec(&mut tools(a).await, &alice(), call("pay", args)).await;
    assert_eq!(
        requested.status(),
        ToolStatus::ApprovalRequired,
        "{requested:?}"
    );
    let id = requested.approval_id.clone();

    // B lists it (from the tenant's index), reads it whole, and approves it.
    let mut on_b = approvals(b).await;
    let listed = on_b
        .list_approvals(bob().request(proto::ListApprovalsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed
            .approvals
            .iter()
            .map(|a| a.approval_id.as_str())
            .collect::<Vec<_>>(),
        [id.as_str()]
    );
    let full = on_b
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(full.arguments_json, args);
    let decided = on_b
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: "ok".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(decided.state(), proto::ApprovalState::Approved);
    assert_eq!(decided.decided_by, "bob");

    // Eight redeemers on A and eight on C at the same moment: one payment.
    let mut redeemers = Vec::new();
    for sidecar in [a, c] {
        for _ in 0..8 {
            redeemers.push(tools(sidecar).await);
        }
    }
    let results = join_all(redeemers.into_iter().map(|mut client| {
        let id = id.clone();
        async move { exec(&mut client, &alice(), redeeming(args, &id)).await }
    }))
    .await;
    let ok: Vec<_> = results
        .iter()
        .filter(|r| r.status() == ToolStatus::Ok)
        .collect();
    assert_eq!(ok.len(), 1, "{results:?}");
    assert!(
        results
            .iter()
            .filter(|r| r.status() != ToolStatus::Ok)
            .all(|r| r.error_type == "approval_already_used"),
        "{results:?}"
    );
    assert_eq!(bank.paid(), 1);
    // Every sidecar sees it used.
    let state = approvals(c)
        .await
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap()
        .state();
    assert_eq!(state, proto::ApprovalState::Used);
}

#[tokio::test]
async fn an_idempotent_duplicate_on_another_sidecar_runs_once() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let sidecars = sidecars(dir.path(), &catalog(&redis.url(), bank.addr, ""), 2);
    let (a, b) = (&sidecars[0], &sidecars[1]);
    // The first call is held at the bank while its duplicate arrives on B.
    bank.gate.send_replace(false);
    let mut on_a = tools(a).await;
    let first = tokio::spawn(async move {
        exec(
            &mut on_a,
            &alice(),
            keyed("charge", r#"{"amount":7}"#, "order-7"),
        )
        .await
    });
    let mut arrived = bank.arrived.clone();
    tokio::time::timeout(Duration::from_secs(10), arrived.wait_for(|n| *n == 1))
        .await
        .expect("the first call reaches the bank")
        .unwrap();
    // A duplicate whose caller will not wait long hears that the first is still running.
    let mut on_b = tools(b).await;
    let mut impatient = alice().request(execute_request(keyed(
        "charge",
        r#"{"amount":7}"#,
        "order-7",
    )));
    impatient.set_timeout(Duration::from_millis(600));
    let busy = on_b
        .execute_tool(impatient)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(
        (
            busy.status(),
            busy.error_type.as_str(),
            busy.retryable,
            busy.refused_by.as_str()
        ),
        (
            ToolStatus::Unavailable,
            "idempotency_in_progress",
            true,
            "idempotency"
        ),
        "{busy:?}"
    );
    // A patient duplicate on B waits for the first's result and gets it.
    let mut on_b_again = tools(b).await;
    let waiting = tokio::spawn(async move {
        exec(
            &mut on_b_again,
            &alice(),
            keyed("charge", r#"{"amount":7}"#, "order-7"),
        )
        .await
    });
    bank.gate.send_replace(true);
    let first = first.await.unwrap();
    let second = waiting.await.unwrap();
    assert_eq!(
        (first.status(), first.idempotent_replay),
        (ToolStatus::Ok, false),
        "{first:?}"
    );
    assert_eq!(
        (second.status(), second.idempotent_replay),
        (ToolStatus::Ok, true),
        "{second:?}"
    );
    assert_eq!(second.model_text, first.model_text);
    assert_eq!(bank.paid(), 1, "the duplicate ran the charge again");
    assert_eq!(*bank.arrived.borrow(), 1);
}

#[tokio::test]
async fn approvals_and_idempotency_keys_survive_a_sidecar_restart() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = catalog(&redis.url(), bank.addr, "");
    let mut first = sidecars(dir.path(), &yaml, 1).remove(0);
    let mut client = tools(&first).await;
    let charged = exec(
        &mut client,
        &alice(),
        keyed("charge", r#"{"amount":3}"#, "k-restart"),
    )
    .await;
    assert_eq!(charged.status(), ToolStatus::Ok, "{charged:?}");
    let id = exec(&mut client, &alice(), call("pay", r#"{"amount":9}"#))
        .await
        .approval_id;
    approvals(&first)
        .await
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: String::new(),
        }))
        .await
        .unwrap();
    // The sidecar dies without a goodbye (an OOM kill, an eviction).
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = sidecars(dir.path(), &yaml, 1).remove(0);
    let mut client = tools(&second).await;
    let replay = exec(
        &mut client,
        &alice(),
        keyed("charge", r#"{"amount":3}"#, "k-restart"),
    )
    .await;
    assert_eq!(
        (replay.status(), replay.idempotent_replay),
        (ToolStatus::Ok, true),
        "{replay:?}"
    );
    assert_eq!(replay.model_text, charged.model_text);
    let paid = exec(&mut client, &alice(), redeeming(r#"{"amount":9}"#, &id)).await;
    assert_eq!(paid.status(), ToolStatus::Ok, "{paid:?}");
    let again = exec(&mut client, &alice(), redeeming(r#"{"amount":9}"#, &id)).await;
    assert_eq!(again.error_type, "approval_already_used");
    assert_eq!(bank.paid(), 2, "one charge and one payment");
}

/// Calls `tool` once and says how it ended and how long it took.
async fn timed(
    client: &mut ToolGateClient<Channel>,
    caller: &Who,
    c: proto::ToolCall,
) -> (proto::ToolResult, Duration) {
    let started = Instant::now();
    let result = exec(client, caller, c).await;
    (result, started.elapsed())
}

/// Polls (bounded) until a call of `limited` is admitted again: the sidecar recovered.
async fn recovered(client: &mut ToolGateClient<Channel>, caller: &Who) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let result = exec(client, caller, call("limited", "{}")).await;
        if result.status() == ToolStatus::Ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no recovery within 20 s: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The outage settings of the fault tests: a short operation timeout.
const SHORT_TIMEOUT: &str = "200ms";

fn short_timeout(yaml: &str) -> String {
    yaml.replace("timeout: 5s", &format!("timeout: {SHORT_TIMEOUT}"))
}

#[tokio::test]
async fn redis_killed_under_load_fails_closed_promptly_and_the_sidecar_recovers() {
    let mut redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = short_timeout(&catalog(&redis.url(), bank.addr, ""));
    let mut sidecar = sidecars(dir.path(), &yaml, 1).remove(0);
    // Each caller has a tenant of its own, so quotas never refuse them here.
    let load = |i: usize| who(["acme", "globex"][i % 2]).subject(&format!("caller-{i}"));
    let mut client = tools(&sidecar).await;
    recovered(&mut client, &load(0)).await;
    let killed = Arc::new(AtomicUsize::new(0));
    // Eight callers keep calling until each has made five calls after Redis died under them.
    let (calls_tx, mut calls_rx) = watch::channel(0usize);
    let callers = (0..8).map(|i| {
        let addr = sidecar.addr.clone();
        let killed = killed.clone();
        let calls_tx = calls_tx.clone();
        async move {
            let mut client = tools_at(&addr).await;
            let mut after_kill = Vec::new();
            for _ in 0..2_000 {
                let before = killed.load(Ordering::SeqCst) == 1;
                let (result, took) = timed(&mut client, &load(i), call("limited", "{}")).await;
                calls_tx.send_modify(|n| *n += 1);
                if before {
                    after_kill.push((result, took));
                    if after_kill.len() == 5 {
                        break;
                    }
                }
            }
            after_kill
        }
    });
    let load_done = tokio::spawn(join_all(callers));
    tokio::time::timeout(Duration::from_secs(20), calls_rx.wait_for(|n| *n >= 16))
        .await
        .expect("calls before the kill")
        .unwrap();
    redis.kill();
    killed.store(1, Ordering::SeqCst);
    let after: Vec<_> = load_done.await.unwrap().into_iter().flatten().collect();
    assert_eq!(
        after.len(),
        40,
        "each caller makes five calls after the kill"
    );
    for (result, took) in &after {
        assert_eq!(
            (
                result.status(),
                result.error_type.as_str(),
                result.refused_by.as_str(),
                result.retryable
            ),
            (
                ToolStatus::Unavailable,
                "state_unavailable",
                "rate_limit",
                true
            ),
            "{result:?}"
        );
        // The timeout is 200 ms; a refused connection answers sooner. Far below the margin.
        assert!(*took < Duration::from_secs(2), "a call took {took:?}");
    }
    // Tools that need no shared state keep working; approvals and idempotency fail closed.
    assert_eq!(
        exec(&mut client, &alice(), call("free", r#"{"text":"hi"}"#))
            .await
            .status(),
        ToolStatus::Ok
    );
    let approval = exec(&mut client, &alice(), call("pay", r#"{"amount":1}"#)).await;
    assert_eq!(
        (
            approval.status(),
            approval.error_type.as_str(),
            approval.refused_by.as_str()
        ),
        (ToolStatus::Unavailable, "state_unavailable", "approval"),
        "{approval:?}"
    );
    let charge = exec(&mut client, &alice(), keyed("charge", "{}", "k-outage")).await;
    assert_eq!(
        (
            charge.status(),
            charge.error_type.as_str(),
            charge.refused_by.as_str()
        ),
        (ToolStatus::Unavailable, "state_unavailable", "idempotency"),
        "{charge:?}"
    );
    assert_eq!(bank.paid(), 0, "something ran without its shared state");
    let admin: std::net::SocketAddr = sidecar.admin_addr.parse().unwrap();
    let (status, body) = http_get(admin, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ready; state backend unreachable\n")
    );
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert_eq!(metric(&metrics, "toolgate_state_backend_up", &[]), 0.0);
    assert!(
        metric(
            &metrics,
            "toolgate_state_failures_total",
            &[("concern", "rate_limits")]
        ) >= 1.0
    );

    // Redis comes back (empty): the sidecar uses it again without a restart.
    redis.restart();
    recovered(&mut client, &alice()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = http_get(admin, "/readyz").await;
        if body == "ready\n" {
            break;
        }
        assert!(Instant::now() < deadline, "/readyz still says {body:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        matches!(sidecar.child.try_wait(), Ok(None)),
        "the sidecar exited"
    );
    drop(client);
    let logs = stop(sidecar).await;
    assert!(!logs.contains("panicked"), "{logs}");
    assert!(logs.contains("state backend unreachable"), "{logs}");
    assert!(logs.contains("state backend reachable"), "{logs}");
}

async fn tools_at(addr: &str) -> ToolGateClient<Channel> {
    ToolGateClient::new(connect(addr).await)
}

#[tokio::test]
async fn a_paused_redis_cannot_stall_calls_past_the_timeout() {
    let redis = RedisServer::start();
    let server = TestServer::start(&short_timeout(&in_process(&redis.url(), ""))).await;
    let mut client = server.client().await;
    recovered(&mut client, &alice()).await;
    // Every client of Redis, the sidecar's connection included, waits for 4 s.
    let paused = redis.command(&["CLIENT", "PAUSE", "4000", "ALL"]).await;
    assert_eq!(paused, redis::Value::Okay);
    let paused_at = Instant::now();
    for i in 0..3 {
        let (result, took) = timed(
            &mut client,
            &who("globex").subject(&format!("p{i}")),
            call("limited", "{}"),
        )
        .await;
        assert_eq!(result.error_type, "state_unavailable", "{result:?}");
        // The timeout is 200 ms; the pause 4 s. Well within the pause, with room for a
        // noisy machine.
        assert!(took < Duration::from_millis(2000), "a call took {took:?}");
    }
    assert!(
        paused_at.elapsed() < Duration::from_secs(4),
        "the pause ended before the checks"
    );
    recovered(&mut client, &alice()).await;
    server.stop().await;
}

#[tokio::test]
async fn a_flushed_script_cache_is_reloaded_transparently() {
    let redis = RedisServer::start();
    let server = TestServer::start(&in_process(&redis.url(), "")).await;
    let mut client = server.client().await;
    let cached = || async { number_of_cached_scripts(&redis.command(&["INFO", "memory"]).await) };
    assert_eq!(
        exec(&mut client, &alice(), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    assert!(cached().await >= 1);
    assert_eq!(
        redis.command(&["SCRIPT", "FLUSH"]).await,
        redis::Value::Okay
    );
    assert_eq!(cached().await, 0);
    // The next call finds no script (NOSCRIPT), loads it and runs: the caller sees nothing.
    let after = exec(&mut client, &alice(), call("limited", "{}")).await;
    assert_eq!(after.status(), ToolStatus::Ok, "{after:?}");
    assert!(cached().await >= 1);
    server.stop().await;
}

/// `number_of_cached_scripts` from an `INFO memory` answer.
pub(crate) fn number_of_cached_scripts(info: &redis::Value) -> u64 {
    let text = match info {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::VerbatimString { text, .. } => text.clone(),
        other => panic!("INFO answered {other:?}"),
    };
    text.lines()
        .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO memory has number_of_cached_scripts")
}

#[tokio::test]
async fn with_local_fallback_each_sidecar_decides_alone_during_an_outage_and_says_so() {
    let mut redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = short_timeout(&catalog(
        &redis.url(),
        bank.addr,
        "  on_unavailable: { rate_limits: local }\n",
    ));
    let sidecar = sidecars(dir.path(), &yaml, 1).remove(0);
    let mut client = tools(&sidecar).await;
    recovered(&mut client, &alice()).await;
    redis.kill();
    // The local limiter starts empty and holds this sidecar to the quota on its own.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let (result, took) = timed(&mut client, &who("globex"), call("limited", "{}")).await;
        assert!(took < Duration::from_secs(2), "a call took {took:?}");
        statuses.push(result.status());
    }
    assert_eq!(
        statuses,
        [
            [ToolStatus::Ok; 5].as_slice(),
            &[ToolStatus::RateLimited; 3]
        ]
        .concat()
    );
    // Approvals and idempotency never fall back: they fail closed.
    let approval = exec(&mut client, &alice(), call("pay", r#"{"amount":1}"#)).await;
    assert_eq!(approval.error_type, "state_unavailable", "{approval:?}");
    let charge = exec(&mut client, &alice(), keyed("charge", "{}", "k")).await;
    assert_eq!(charge.error_type, "state_unavailable", "{charge:?}");
    let admin: std::net::SocketAddr = sidecar.admin_addr.parse().unwrap();
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert_eq!(
        metric(&metrics, "toolgate_rate_limit_local_decisions_total", &[]),
        8.0
    );
    drop(client);
    let logs = stop(sidecar).await;
    assert_eq!(
        logs.matches("shared rate limits unavailable: this sidecar decides quotas alone")
            .count(),
        1,
        "one warning per outage, not one per call: {logs}"
    );
}

#[tokio::test]
async fn when_the_state_is_required_an_outage_makes_the_sidecar_unready() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let mut redis = RedisServer::start();
    let server = TestServer::start(&short_timeout(&in_process(
        &redis.url(),
        "  unready_when_unavailable: true\n",
    )))
    .await;
    let mut health = HealthClient::new(server.channel().await);
    let admin = server.admin_addr();
    async fn status(health: &mut HealthClient<Channel>, service: &str) -> ServingStatus {
        health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    }
    // Polls (bounded) until the overall health, the state's and /readyz say `want`.
    async fn settles(
        health: &mut HealthClient<Channel>,
        admin: std::net::SocketAddr,
        want: ServingStatus,
        readyz: (u16, &str),
    ) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now = (
                status(health, "").await,
                status(health, "toolgate.state").await,
                http_get(admin, "/readyz").await,
            );
            if now.0 == want && now.1 == want && (now.2.0, now.2.1.as_str()) == readyz {
                return;
            }
            assert!(Instant::now() < deadline, "still {now:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    settles(&mut health, admin, ServingStatus::Serving, (200, "ready\n")).await;
    redis.kill();
    // Nothing calls: the health check alone notices.
    settles(
        &mut health,
        admin,
        ServingStatus::NotServing,
        (503, "not ready: state backend unreachable\n"),
    )
    .await;
    redis.restart();
    settles(&mut health, admin, ServingStatus::Serving, (200, "ready\n")).await;
    server.stop().await;
}

#[tokio::test]
async fn approvals_expire_and_idempotency_windows_end_on_redis_time() {
    let redis = RedisServer::start();
    let yaml = in_process(&redis.url(), "")
        .replace("approvals: { ttl: 5m }", "approvals: { ttl: 1s }\nlimits: { idempotency_window: 1s }")
        .replace(
            "  - { name: pay,",
            "  - { name: sign, description: Signs., risk_level: write_confirmed, executor: { builtin: echo_arguments }, input_schema: { type: object } }\n  - { name: pay,",
        );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let mut approvals = server.approvals().await;
    let id = exec(&mut client, &alice(), call("sign", "{}"))
        .await
        .approval_id;
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: String::new(),
        }))
        .await
        .unwrap();
    // Redis's clock moves on its own: watch the approval until it expires (bounded).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let state = approvals
            .get_approval(bob().request(proto::GetApprovalRequest {
                approval_id: id.clone(),
            }))
            .await
            .unwrap()
            .into_inner()
            .approval
            .unwrap()
            .state();
        if state == proto::ApprovalState::Expired {
            break;
        }
        assert_eq!(state, proto::ApprovalState::Approved);
        assert!(Instant::now() < deadline, "not expired after its 1 s TTL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut redeem = call("sign", "{}");
    redeem.approval_id = id;
    let late = exec(&mut client, &alice(), redeem).await;
    assert_eq!(late.error_type, "approval_expired", "{late:?}");

    // Within the window the key belongs to its first arguments; after it, to anyone's.
    let first = exec(&mut client, &alice(), keyed("free", r#"{"text":"a"}"#, "w")).await;
    assert_eq!(first.status(), ToolStatus::Ok);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let other = exec(&mut client, &alice(), keyed("free", r#"{"text":"b"}"#, "w")).await;
        if other.status() == ToolStatus::Ok {
            assert!(!other.idempotent_replay);
            assert_eq!(other.model_text, "b");
            break;
        }
        assert_eq!(other.error_type, "idempotency_conflict", "{other:?}");
        assert!(Instant::now() < deadline, "the 1 s window never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

on_both_backends!(list_approvals_pages_through_the_tenants_approvals_in_creation_order);

async fn list_approvals_pages_through_the_tenants_approvals_in_creation_order(backend: Backend) {
    let server = TestServer::start_on(backend, crate::support::STAGES).await;
    let mut client = server.client().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        // In memory, pairs share a millisecond of the test's clock (Redis's own clock decides
        // there): creation time orders them, then ids within a millisecond.
        if i % 2 == 0 {
            server.clock.advance(std::time::Duration::from_millis(3));
        }
        let id = exec(
            &mut client,
            &alice(),
            call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
        )
        .await
        .approval_id;
        ids.push(id);
    }
    // Another tenant's approval is never on acme's pages.
    let globex = exec(&mut client, &who("globex"), call("approve_me", "{}")).await;
    assert_eq!(globex.status(), ToolStatus::ApprovalRequired);
    let mut approvals = server.approvals().await;
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    for _ in 0..10 {
        let page = approvals
            .list_approvals(bob().request(proto::ListApprovalsRequest {
                page_size: 3,
                page_token: token.clone(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.approvals.len() <= 3);
        seen.extend(
            page.approvals
                .into_iter()
                .map(|a| (a.created_at_unix_ms, a.approval_id)),
        );
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    // Across the pages: oldest first, ties by id, computed from the approvals' own fields.
    let mut by_creation = seen.clone();
    by_creation.sort();
    assert_eq!(seen, by_creation, "the pages' order");
    let mut expected = ids.clone();
    expected.sort();
    let mut got: Vec<String> = seen.iter().map(|(_, id)| id.clone()).collect();
    got.sort();
    assert_eq!(got, expected, "every approval exactly once");
    assert_eq!(pages, 3, "{seen:?}");
    let bad = approvals
        .list_approvals(bob().request(proto::ListApprovalsRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test]
async fn the_password_comes_from_the_environment_is_checked_and_never_logged() {
    let secret = "correct-horse-battery-staple";
    let redis = RedisServer::start_with(&["--requirepass", secret]);
    let dir = tempfile::tempdir().unwrap();
    let yaml = catalog(&redis.url(), "127.0.0.1:9".parse().unwrap(), "").replace(
        "timeout: 5s }",
        "timeout: 5s, password_env: REDIS_PASSWORD }",
    );
    let path = dir.path().join("catalog.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let path = path.display().to_string();
    let check = |password: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["check", "--connect", "--config", &path])
            .env("REDIS_PASSWORD", password)
            .output()
            .unwrap()
    };
    let ok = check(secret);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{ok:?}");
    assert!(
        stdout.contains(&format!("state backend {}: ok", redis.url())),
        "{stdout}"
    );
    let wrong = check("wrong-password");
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(1), "{wrong:?}");
    assert!(stderr.contains("state backend"), "{stderr}");
    assert!(!stderr.contains("wrong-password"), "{stderr}");
    // Served: calls work, and the password appears in no log line.
    let sidecar = spawn_with_env(&["--config", &path], &[("REDIS_PASSWORD", secret)]);
    let mut client = tools(&sidecar).await;
    assert_eq!(
        exec(&mut client, &alice(), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    drop(client);
    let logs = stop(sidecar).await;
    assert!(!logs.contains(secret), "{logs}");
}

/// What a Redis holds for 1,000 tenants (docs/performance.md, "What a Redis costs"): the
/// measurement, not run by default (`cargo test --test integration redis_cost -- --ignored
/// --nocapture`).
#[tokio::test]
#[ignore = "a measurement for docs/performance.md; takes a minute in a debug build"]
async fn redis_cost_per_1000_tenants() {
    redis_cost(1000).await;
}

/// The same for 50 tenants, run by default: the keys and bytes per tenant the docs state hold.
#[tokio::test]
async fn redis_cost_per_50_tenants() {
    redis_cost(50).await;
}

/// What a Redis holds for `n` tenants (a multiple of 50, at least 8), each with a tool quota and a
/// tenant quota in use, one pending approval and one stored idempotent result; prints it and
/// checks it against the per-tenant bounds docs/performance.md states.
async fn redis_cost(n: usize) {
    let redis = RedisServer::start();
    let tenants: String = (0..n)
        .map(|i| format!("  tenant-{i:04}: {{ rate_limit: 1000/min }}\n"))
        .collect();
    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
{state}tenants:
{tenants}tools:
  - {{ name: search, description: Searches., risk_level: read_only, rate_limit: 100/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: refund, description: Refunds., risk_level: write_confirmed, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: note, description: Writes a note., risk_level: write_draft, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
"#,
        state = redis_state(&redis.url()),
    );
    let server = TestServer::start(&yaml).await;
    let number = |value: redis::Value| match value {
        redis::Value::Int(n) => n,
        other => panic!("expected a number, got {other:?}"),
    };
    let used_memory = |info: redis::Value| -> i64 {
        let text = match info {
            redis::Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
            redis::Value::VerbatimString { text, .. } => text,
            other => panic!("INFO answered {other:?}"),
        };
        text.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    };
    let mut client = server.client().await;
    // One round first, so the scripts are cached before the baseline.
    exec(&mut client, &who("tenant-0000"), call("search", "{}")).await;
    redis.command(&["FLUSHALL"]).await;
    let before = used_memory(redis.command(&["INFO", "memory"]).await);
    for chunk in 0..n / 50 {
        let calls = (0..50).map(|j| {
            let mut client = client.clone();
            let tenant = format!("tenant-{:04}", chunk * 50 + j);
            async move {
                let caller = who(&tenant);
                let searched = exec(
                    &mut client,
                    &caller,
                    call("search", r#"{"q":"refund policy"}"#),
                )
                .await;
                let asked = exec(
                    &mut client,
                    &caller,
                    call("refund", r#"{"order_id":"A-1001","amount_cents":2500}"#),
                )
                .await;
                let noted = exec(
                    &mut client,
                    &caller,
                    keyed(
                        "note",
                        r#"{"text":"customer called about order A-1001"}"#,
                        "note-1",
                    ),
                )
                .await;
                (searched.status(), asked.status(), noted.status())
            }
        });
        for statuses in join_all(calls).await {
            assert_eq!(
                statuses,
                (ToolStatus::Ok, ToolStatus::ApprovalRequired, ToolStatus::Ok)
            );
        }
    }
    let after = used_memory(redis.command(&["INFO", "memory"]).await);
    // Quota keys last only until their state says nothing a fresh key would not: one emission
    // interval (here 0.6 s and 60 ms) after the tenant's last call. Count the lasting ones, then
    // call once more to weigh a live pair.
    let keys = number(redis.command(&["DBSIZE"]).await);
    let live = exec(&mut client, &who("tenant-0007"), call("search", "{}")).await;
    assert_eq!(live.status(), ToolStatus::Ok);
    let mut sizes = Vec::new();
    for (what, key) in [
        (
            "tool quota",
            "toolgate:{tenant-0007}:rl:tool:search:100/60s/100",
        ),
        (
            "tenant quota",
            "toolgate:{tenant-0007}:rl:tenant:1000/60s/1000",
        ),
        ("approvals pending", "toolgate:{tenant-0007}:apr:st:pending"),
        ("approvals due", "toolgate:{tenant-0007}:apr:due"),
        ("approvals sizes", "toolgate:{tenant-0007}:apr:sizes"),
        ("approvals usage", "toolgate:{tenant-0007}:apr:usage"),
        ("idempotency index", "toolgate:{tenant-0007}:idem:index"),
        ("idempotency sizes", "toolgate:{tenant-0007}:idem:sizes"),
        ("idempotency usage", "toolgate:{tenant-0007}:idem:usage"),
    ] {
        sizes.push((what, number(redis.command(&["MEMORY", "USAGE", key]).await)));
    }
    // The approval and the idempotency entry are named by ids: find them.
    for (what, pattern) in [
        ("approval", "toolgate:{tenant-0007}:apr:apr_*"),
        ("idempotency entry", "toolgate:{tenant-0007}:idem:[0-9a-f]*"),
    ] {
        let found = match redis.command(&["KEYS", pattern]).await {
            redis::Value::Array(keys) => keys,
            other => panic!("KEYS answered {other:?}"),
        };
        assert_eq!(found.len(), 1, "{what}: {found:?}");
        let key = match &found[0] {
            redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).unwrap(),
            other => panic!("{other:?}"),
        };
        sizes.push((
            what,
            number(redis.command(&["MEMORY", "USAGE", &key]).await),
        ));
    }
    println!(
        "{n} tenants: {keys} keys, used_memory grew by {} bytes",
        after - before
    );
    for (what, bytes) in &sizes {
        println!("  {what}: {bytes} bytes (MEMORY USAGE)");
    }
    // An approval and its four sets and totals, an idempotency entry and its three keys; of
    // the quotas' two, those of the last tenants called may not have expired yet.
    // What all the keys hold, per tenant (the docs' ~3.7 KB), and used_memory's growth, which
    // also counts Redis's fixed costs (its tables grow in powers of two): under 1 MiB of those.
    let mut held = 0;
    if let redis::Value::Array(all) = redis.command(&["KEYS", "*"]).await {
        for key in all {
            if let redis::Value::BulkString(bytes) = key {
                let key = String::from_utf8(bytes).unwrap();
                if let redis::Value::Int(bytes) = redis.command(&["MEMORY", "USAGE", &key]).await {
                    held += bytes;
                }
            }
        }
    }
    println!(
        "  all keys: {held} bytes (MEMORY USAGE), {} per tenant",
        held / i64::try_from(n).unwrap()
    );
    let n = i64::try_from(n).unwrap();
    assert!((9 * n..=11 * n).contains(&keys), "{keys} keys");
    assert!(held < 4096 * n, "{held} bytes in the keys");
    assert!(
        after - before < 8 * 1024 * n + 1024 * 1024,
        "{} bytes",
        after - before
    );
    server.stop().await;
}

#[tokio::test]
async fn rediss_is_verified_against_the_configured_ca() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let fixture = |name: &str| fixtures.join(name).display().to_string();
    let redis = RedisServer::start_tls(&[
        "--tls-cert-file",
        &fixture("redis-server.pem"),
        "--tls-key-file",
        &fixture("redis-server-key.pem"),
        "--tls-ca-cert-file",
        &fixture("redis-ca.pem"),
        "--tls-auth-clients",
        "no",
    ]);
    let tls_port = redis.tls_port().expect("started with TLS");
    let url = format!("rediss://127.0.0.1:{tls_port}");
    // Without the test CA, the server's certificate is not trusted: nothing is sent.
    let dir = tempfile::tempdir().unwrap();
    let untrusted = dir.path().join("catalog.yaml");
    std::fs::write(&untrusted, in_process(&url, "")).unwrap();
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["check", "--connect", "--config"])
        .arg(&untrusted)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert_eq!(checked.status.code(), Some(1), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
    // With it, calls go through TLS to this Redis.
    let yaml = in_process(&url, "").replace(
        "timeout: 5s }",
        "timeout: 5s, ca_file: tests/fixtures/redis-ca.pem }",
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let result = exec(&mut client, &alice(), call("limited", "{}")).await;
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    let exists = redis
        .command(&["EXISTS", "toolgate:{acme}:rl:tool:limited:5/60s/5"])
        .await;
    assert_eq!(exists, redis::Value::Int(1));
    server.stop().await;
}

on_both_backends!(approvals_and_stored_results_are_bounded_per_tenant);

async fn approvals_and_stored_results_are_bounded_per_tenant(backend: Backend) {
    let yaml = crate::support::STAGES
        .replacen(
            "version: 1\n",
            "version: 1\napprovals: { max_per_tenant: 3 }\n",
            1,
        )
        .replace(
            "limits: { max_arguments_bytes: 4096,",
            "limits: { idempotency_max_bytes_per_tenant: 2048, max_arguments_bytes: 8192,",
        );
    let server = TestServer::start_on(backend, &yaml).await;
    let mut client = server.client().await;
    let mut approvals = server.approvals().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let asked = exec(
            &mut client,
            &alice(),
            call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
        )
        .await;
        assert_eq!(asked.status(), ToolStatus::ApprovalRequired);
        ids.push(asked.approval_id);
    }
    // Three open approvals are the tenant's budget: open ones are never dropped for a fourth.
    let full = exec(&mut client, &alice(), call("approve_me", r#"{"amount":3}"#)).await;
    assert_eq!(
        (full.status(), full.error_type.as_str(), full.retryable),
        (ToolStatus::Unavailable, "overloaded", true),
        "{full:?}"
    );
    // Once one is decided (finished), the oldest finished one makes room.
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: ids[1].clone(),
            decision: ApprovalDecision::Reject as i32,
            reason: "no".into(),
        }))
        .await
        .unwrap();
    let fourth = exec(&mut client, &alice(), call("approve_me", r#"{"amount":3}"#)).await;
    assert_eq!(fourth.status(), ToolStatus::ApprovalRequired, "{fourth:?}");
    let gone = approvals
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: ids[1].clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);

    // A result larger than the tenant's byte budget is not kept, but its key is: the repeat
    // says so instead of running the tool again.
    let big = "x".repeat(4000);
    let args = format!(r#"{{"text":"{big}"}}"#);
    let first = exec(&mut client, &alice(), keyed("echo", &args, "big")).await;
    assert_eq!(
        (first.status(), first.model_text.len()),
        (ToolStatus::Ok, 4000)
    );
    let runs = server.builtins().executions();
    let again = exec(&mut client, &alice(), keyed("echo", &args, "big")).await;
    assert_eq!(
        (
            again.status(),
            again.error_type.as_str(),
            again.idempotent_replay
        ),
        (ToolStatus::Error, "output_too_large", true),
        "{again:?}"
    );
    assert!(
        again.error_message.contains("too large to keep"),
        "{again:?}"
    );
    assert_eq!(server.builtins().executions(), runs, "the tool ran again");
    server.stop().await;
}

#[tokio::test]
async fn moving_the_state_elsewhere_needs_a_restart() {
    let server = TestServer::start_file(crate::support::STAGES).await;
    let moved = crate::support::STAGES.replacen(
        "version: 1\n",
        &format!("version: 1\n{}", redis_state("redis://127.0.0.1:6379")),
        1,
    );
    server.write_catalog(&server.catalog_file(), &moved);
    let refused = server.reload().await.unwrap_err();
    assert!(
        refused.contains("state") && refused.contains("restart"),
        "{refused}"
    );
    // Still serving from memory.
    let mut client = server.client().await;
    assert_eq!(
        exec(&mut client, &alice(), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    server.stop().await;
}

#[tokio::test]
async fn on_a_redis_cluster_each_tenant_keeps_to_one_slot_and_every_concern_works() {
    let cluster = crate::redis_server::RedisCluster::start(3);
    let tenants: Vec<String> = (0..12).map(|i| format!("tenant-{i:02}")).collect();
    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
state:
  backend: redis
  redis: {{ url: "{url}", cluster: true, timeout: 5s }}
tenants:
{tenants}tools:
  - {{ name: limited, description: Five a minute., risk_level: read_only, rate_limit: 5/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: sign, description: Signs once approved., risk_level: write_confirmed, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: note, description: Notes., risk_level: write_draft, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
"#,
        url = cluster.url(),
        tenants = tenants
            .iter()
            .map(|t| format!("  {t}: {{ rate_limit: 100/min }}\n"))
            .collect::<String>(),
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let mut approvals = server.approvals().await;
    for tenant in &tenants {
        let caller = who(tenant).subject("alice");
        // Both quotas in one script on the tenant's node: exactly the quota.
        let mut admitted = 0;
        for _ in 0..7 {
            if exec(&mut client, &caller, call("limited", "{}"))
                .await
                .status()
                == ToolStatus::Ok
            {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5, "{tenant}");
        // An approval: requested, listed, approved, used once.
        let id = exec(&mut client, &caller, call("sign", "{}"))
            .await
            .approval_id;
        let approver = who(tenant).subject("bob").scopes(APPROVE);
        let listed = approvals
            .list_approvals(approver.request(proto::ListApprovalsRequest::default()))
            .await
            .unwrap()
            .into_inner()
            .approvals;
        assert_eq!(listed.len(), 1, "{tenant}");
        approvals
            .decide_approval(approver.request(proto::DecideApprovalRequest {
                approval_id: id.clone(),
                decision: ApprovalDecision::Approve as i32,
                reason: String::new(),
            }))
            .await
            .unwrap();
        let mut redeem = call("sign", "{}");
        redeem.approval_id = id;
        assert_eq!(
            exec(&mut client, &caller, redeem.clone()).await.status(),
            ToolStatus::Ok
        );
        assert_eq!(
            exec(&mut client, &caller, redeem).await.error_type,
            "approval_already_used"
        );
        // An idempotent call, replayed.
        let first = exec(&mut client, &caller, keyed("note", "{}", "k")).await;
        let again = exec(&mut client, &caller, keyed("note", "{}", "k")).await;
        assert_eq!(
            (first.idempotent_replay, again.idempotent_replay),
            (false, true)
        );
    }
    // The tenants' keys are spread over the nodes: it really is a cluster.
    let mut holding = 0;
    for node in &cluster.nodes {
        if node.command(&["DBSIZE"]).await != redis::Value::Int(0) {
            holding += 1;
        }
    }
    assert!(holding >= 2, "all keys on {holding} node(s)");
    // Scripts flushed on every node are loaded again on the node that needs them.
    for node in &cluster.nodes {
        node.command(&["SCRIPT", "FLUSH"]).await;
    }
    let after = exec(&mut client, &who("tenant-00"), keyed("note", "{}", "k2")).await;
    assert_eq!(after.status(), ToolStatus::Ok, "{after:?}");
    server.stop().await;
}

async fn explain_on(
    sidecar: &Spawned,
    who: &Who,
    call: proto::ToolCall,
) -> proto::ExplainToolResponse {
    let request = execute_request(call);
    tools(sidecar)
        .await
        .explain_tool(who.request(proto::ExplainToolRequest {
            call: request.call,
            run_id: request.run_id,
            step: request.step,
            catalog_revision: request.catalog_revision,
        }))
        .await
        .expect("ExplainTool answers")
        .into_inner()
}

fn explained_stage<'a>(
    explained: &'a proto::ExplainToolResponse,
    name: &str,
) -> &'a proto::StageExplanation {
    explained
        .stages
        .iter()
        .find(|s| s.stage == name)
        .unwrap_or_else(|| panic!("no stage {name} in {explained:?}"))
}

/// ExplainTool on one sidecar reads the state the others share: a quota used up, an approval
/// decided and a key stored elsewhere are what it reports, and explaining changes none of them.
#[tokio::test]
async fn explain_on_one_sidecar_reads_what_the_others_did() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let sidecars = sidecars(dir.path(), &catalog(&redis.url(), bank.addr, ""), 2);
    let (a, b) = (&sidecars[0], &sidecars[1]);
    let mut on_a = tools(a).await;

    // The quota, used up on A, is exhausted on B.
    for _ in 0..5 {
        let used = exec(&mut on_a, &alice(), call("limited", "{}")).await;
        assert_eq!(used.status(), ToolStatus::Ok, "{used:?}");
    }
    let explained = explain_on(b, &alice(), call("limited", "{}")).await;
    let decision = explained.decision.clone().unwrap();
    assert_eq!(
        (decision.status(), decision.refused_by.as_str()),
        (ToolStatus::RateLimited, "rate_limit"),
        "{explained:?}"
    );
    assert_eq!(
        explained_stage(&explained, "rate_limit").quotas[0].remaining,
        0
    );

    // A key stored on A would be replayed on B; other arguments under it conflict.
    let charged = exec(
        &mut on_a,
        &alice(),
        keyed("charge", r#"{"amount":9}"#, "order-9"),
    )
    .await;
    assert_eq!(charged.status(), ToolStatus::Ok, "{charged:?}");
    let explained = explain_on(b, &alice(), keyed("charge", r#"{"amount":9}"#, "order-9")).await;
    let decision = explained.decision.clone().unwrap();
    assert_eq!(
        (decision.status(), decision.idempotent_replay),
        (ToolStatus::Ok, true),
        "{explained:?}"
    );
    let explained = explain_on(b, &alice(), keyed("charge", r#"{"amount":10}"#, "order-9")).await;
    assert_eq!(
        explained.decision.clone().unwrap().error_type,
        "idempotency_conflict",
        "{explained:?}"
    );

    // An approval created on A and approved there would be accepted on B.
    let args = r#"{"amount":250}"#;
    let requested = exec(&mut on_a, &alice(), call("pay", args)).await;
    assert_eq!(requested.status(), ToolStatus::ApprovalRequired);
    let id = requested.approval_id.clone();
    let explained = explain_on(b, &alice(), redeeming(args, &id)).await;
    assert_eq!(
        explained.decision.clone().unwrap().error_type,
        "approval_pending",
        "{explained:?}"
    );
    approvals(a)
        .await
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: "ok".into(),
        }))
        .await
        .unwrap();
    let explained = explain_on(b, &alice(), redeeming(args, &id)).await;
    assert_eq!(
        explained.decision.clone().unwrap().status(),
        ToolStatus::Ok,
        "{explained:?}"
    );
    assert_eq!(
        explained_stage(&explained, "approval").result(),
        proto::StageResult::Passed
    );

    // Explaining changed nothing: the approval is still redeemable once, the key still replays,
    // and the bank was paid once for the charge and once for the approved payment.
    let paid = exec(&mut tools(b).await, &alice(), redeeming(args, &id)).await;
    assert_eq!(paid.status(), ToolStatus::Ok, "{paid:?}");
    let replayed = exec(
        &mut tools(b).await,
        &alice(),
        keyed("charge", r#"{"amount":9}"#, "order-9"),
    )
    .await;
    assert!(replayed.idempotent_replay, "{replayed:?}");
    assert_eq!(bank.paid(), 2);
}

/// The throwaway Redis of a test is the one the test started: another Redis answering on the
/// port it probed is not taken for it (the one we started exits, the port being taken).
#[tokio::test]
async fn a_redis_already_on_the_probed_port_is_not_taken_for_ours() {
    let theirs = RedisServer::start();
    assert!(
        crate::redis_server::RedisServer::try_start_on(theirs.port(), &[]).is_none(),
        "a Redis we did not start was taken for ours"
    );
    // With a password too (INFO needs AUTH then), ours is recognised as ours.
    let ours = RedisServer::start_with(&["--requirepass", "pw"]);
    assert!(ours.pid().is_some());
    // And the other Redis still serves, untouched.
    assert_eq!(
        theirs.command(&["PING"]).await,
        redis::Value::SimpleString("PONG".into())
    );
}
