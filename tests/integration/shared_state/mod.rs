//! State shared through Redis (issue 13): real `toolgate` binaries sharing one real
//! redis-server on loopback — quotas exact across sidecars, an approval created on one, decided
//! on another and redeemed once on a third, idempotent duplicates run once across sidecars and
//! restarts — and the outage behaviour: Redis killed, restarted, paused, its scripts flushed.
//! Backends that run a tool are counted at a real HTTP upstream every sidecar calls.

pub(crate) mod approvals_at_scale;
pub(crate) mod bounds;
pub(crate) mod cluster;
pub(crate) mod cost;
pub(crate) mod credentials;
pub(crate) mod explain;
pub(crate) mod late_answers;
pub(crate) mod outages;
pub(crate) mod refusals;
pub(crate) mod secrets;
pub(crate) mod windows;

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
