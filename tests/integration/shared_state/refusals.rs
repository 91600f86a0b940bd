//! A Redis that refuses one operation is not a Redis that is down (issue 25, item 6), and what
//! ExplainTool says while Redis cannot be reached (issue 27, item 9). Real redis-servers: one at
//! `maxmemory` with `noeviction`, as docs/limits.md advises, and a port that refuses.

use toolgate::proto::{self, ToolStatus};

use crate::{
    shared_state::keyed,
    support::{
        RedisServer, TestServer, call, exec, execute_request, http_get, metric, refusing_port, who,
    },
};

fn catalog(url: &str, timeout: &str) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
state:
  backend: redis
  redis: {{ url: "{url}", timeout: {timeout} }}
  on_unavailable: {{ rate_limits: local }}
tenants: {{ acme: {{}}, globex: {{}} }}
tools:
  - {{ name: limited, description: Five a minute., risk_level: read_only, rate_limit: 5/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: pay, description: Pays once approved., risk_level: write_confirmed, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: note, description: Notes., risk_level: write_draft, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
"#
    )
}

fn used_memory(info: redis::Value) -> (u64, u64) {
    let text = crate::support::info_text(info);
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO memory has {name}"))
    };
    (field("used_memory:"), field("maxmemory:"))
}

fn refused_by_redis(result: &proto::ToolResult, stage: &str) {
    assert_eq!(
        (
            result.status(),
            result.error_type.as_str(),
            result.refused_by.as_str()
        ),
        (ToolStatus::Unavailable, "state_unavailable", stage),
        "{result:?}"
    );
    assert!(
        result.error_message.contains("refused the operation"),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_full_redis_refuses_writes_but_keeps_deciding_and_is_not_an_outage() {
    let redis =
        RedisServer::start_with(&["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"]);
    let server = TestServer::start(&catalog(&redis.url(), "5s")).await;
    let mut client = server.client().await;
    // globex uses up its quota while Redis has room.
    for _ in 0..5 {
        let used = exec(&mut client, &who("globex"), call("limited", "{}")).await;
        assert_eq!(used.status(), ToolStatus::Ok, "{used:?}");
    }
    // Something else fills Redis to its maxmemory (a script is let finish what it started).
    redis
        .command(&[
            "EVAL",
            "for i = 1, 10000 do redis.call('SET', 'fill:' .. i, string.rep('x', 1024)) end return 1",
            "0",
        ])
        .await;
    let (used, max) = used_memory(redis.command(&["INFO", "memory"]).await);
    assert!(used > max, "{used} of {max}");
    // Writes are refused as such: a new approval, a quota's first call, an idempotency claim.
    refused_by_redis(
        &exec(&mut client, &who("acme"), call("pay", "{}")).await,
        "approval",
    );
    refused_by_redis(
        &exec(&mut client, &who("acme"), call("limited", "{}")).await,
        "rate_limit",
    );
    refused_by_redis(
        &exec(&mut client, &who("acme"), keyed("note", "{}", "k")).await,
        "idempotency",
    );
    // Redis still decides what needs no write: globex's quota is used up, where this sidecar's
    // own limiter (which starts empty) would have admitted the call.
    let limited = exec(&mut client, &who("globex"), call("limited", "{}")).await;
    assert_eq!(limited.status(), ToolStatus::RateLimited, "{limited:?}");
    // Not an outage: still reachable and ready, and no quota was decided locally.
    let admin = server.admin_addr();
    let (status, body) = http_get(admin, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert_eq!(metric(&metrics, "toolgate_state_backend_up", &[]), 1.0);
    assert_eq!(
        metric(&metrics, "toolgate_rate_limit_local_decisions_total", &[]),
        0.0
    );
    // With room again, the same calls go through.
    redis
        .command(&[
            "EVAL",
            "for i = 1, 10000 do redis.call('DEL', 'fill:' .. i) end return 1",
            "0",
        ])
        .await;
    let again = exec(&mut client, &who("acme"), call("limited", "{}")).await;
    assert_eq!(again.status(), ToolStatus::Ok, "{again:?}");
    server.stop().await;
}

#[tokio::test]
async fn explain_with_redis_unreachable_says_the_quota_is_unknown_and_a_key_cannot_be_checked() {
    let (_refusing, addr) = refusing_port();
    let server = TestServer::start(&catalog(&format!("redis://{addr}"), "200ms")).await;
    let mut client = server.client().await;
    let request = execute_request(keyed("limited", "{}", "k"));
    let explained = client
        .explain_tool(who("acme").request(proto::ExplainToolRequest {
            call: request.call,
            run_id: request.run_id,
            step: request.step,
            catalog_revision: request.catalog_revision,
        }))
        .await
        .expect("ExplainTool answers")
        .into_inner();
    let stage = |name: &str| {
        explained
            .stages
            .iter()
            .find(|s| s.stage == name)
            .unwrap_or_else(|| panic!("no stage {name} in {explained:?}"))
            .clone()
    };
    let rate = stage("rate_limit");
    assert_eq!(rate.quotas.len(), 1, "{rate:?}");
    assert!(!rate.quotas[0].tracked, "{rate:?}");
    assert!(rate.detail.contains("unknown"), "{rate:?}");
    let decision = explained.decision.clone().unwrap();
    assert_eq!(
        (
            decision.status(),
            decision.error_type.as_str(),
            decision.refused_by.as_str(),
            explained.would_execute
        ),
        (
            ToolStatus::Unavailable,
            "state_unavailable",
            "idempotency",
            false
        ),
        "{explained:?}"
    );
    assert_eq!(
        stage("idempotency").result(),
        proto::StageResult::Refused,
        "{explained:?}"
    );
    server.stop().await;
}
