//! Redis killed, paused or its scripts flushed: calls fail closed promptly, the sidecar recovers, and with local fallback each sidecar decides alone and says so.

use super::*;

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
