//! Quota cost (issue 30): a tool's `rate_limit.cost` is a CEL expression over the call whose
//! value is the cells of the tool's quota the call takes — GCRA with a weight, in memory and in
//! the Redis script alike. A cost over the burst is refused as never admissible; a negative cost
//! or one that cannot be evaluated is refused as a condition error, audited.

use futures::future::join_all;
use toolgate::proto::{self, ToolStatus};

use crate::{
    chain::conditions::{audited, call_as},
    shared_state::{connect, tools},
    support::binary::spawn,
    support::{Backend, RedisServer, TestServer, call, exec, on_both_backends, redis_state, who},
};

/// `search` costs its `top_k` cells of 100 an hour (no cell comes back during a test: one
/// every 36 s). The tenant's overall quota counts calls.
const CATALOG: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: { rate_limit: 1000/h }, globex: {} }
tools:
  - name: search
    description: Searches; a larger top_k costs more of the quota.
    risk_level: read_only
    rate_limit: { quota: 100/h, cost: "int(args.top_k)" }
    redact: [/query]
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties: { top_k: { type: integer }, query: { type: string } }
  - name: weighed
    description: Costs a double, which is not a number of cells.
    risk_level: read_only
    rate_limit: { quota: 100/h, cost: "args.weight * 2.0" }
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { weight: { type: number } } }
"#;

fn search(top_k: i64) -> proto::ToolCall {
    call("search", &format!(r#"{{"top_k":{top_k}}}"#))
}

on_both_backends!(a_call_takes_its_cost_in_cells_and_a_cost_that_cannot_be_taken_is_refused);

async fn a_call_takes_its_cost_in_cells_and_a_cost_that_cannot_be_taken_is_refused(
    backend: Backend,
) {
    let server = TestServer::start_on(backend, CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    // 60 + 30 + 10 = 100 cells: all of the burst.
    for top_k in [60, 30] {
        let result = exec(&mut client, &acme, search(top_k)).await;
        assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    }
    // Eleven do not fit into the ten left: refused, retryable, consuming nothing...
    let over = exec(&mut client, &acme, search(11)).await;
    assert_eq!(
        (over.status(), over.error_type.as_str(), over.retryable),
        (ToolStatus::RateLimited, "rate_limited", true),
        "{over:?}"
    );
    // One cell every 36 s: the eleventh is there in (at most) 36 s.
    assert!((1..=36_000).contains(&over.retry_after_ms), "{over:?}");
    // ... so ten still do.
    let ten = exec(&mut client, &acme, search(10)).await;
    assert_eq!(ten.status(), ToolStatus::Ok, "{ten:?}");
    let one = exec(&mut client, &acme, search(1)).await;
    assert_eq!(one.status(), ToolStatus::RateLimited, "{one:?}");
    // A call that costs nothing passes an exhausted quota.
    let free = exec(&mut client, &acme, search(0)).await;
    assert_eq!(free.status(), ToolStatus::Ok, "{free:?}");
    // Another tenant's cells are its own; and more than the burst can never be admitted: it is
    // refused as such, not told to wait.
    let globex = who("globex");
    let never = exec(&mut client, &globex, search(101)).await;
    assert_eq!(
        (
            never.status(),
            never.error_type.as_str(),
            never.retryable,
            never.retry_after_ms
        ),
        (ToolStatus::RateLimited, "cost_over_burst", false, 0),
        "{never:?}"
    );
    assert!(
        never.error_message.contains("costs 101") && never.error_message.contains("burst of 100"),
        "{never:?}"
    );
    let all = exec(&mut client, &globex, search(100)).await;
    assert_eq!(all.status(), ToolStatus::Ok, "{all:?}");
    // Decided closed: a negative cost, a missing argument, a value that is not an integer.
    for (tool, args, error) in [
        ("search", r#"{"top_k":-5}"#, "cannot be negative"),
        ("search", r#"{}"#, "top_k"),
        ("weighed", r#"{"weight":1.5}"#, "not an int"),
    ] {
        let call_id = format!("closed-{tool}-{}", args.len());
        let refused = exec(&mut client, &who("acme"), call_as(&call_id, tool, args)).await;
        assert_eq!(
            (
                refused.status(),
                refused.error_type.as_str(),
                refused.refused_by.as_str()
            ),
            (ToolStatus::Denied, "condition_error", "rate_limit"),
            "{refused:?}"
        );
        assert!(
            refused
                .error_message
                .contains(&format!("{tool}@1.rate_limit.cost"))
                && refused.error_message.contains(error),
            "{refused:?}"
        );
        let event = audited(&server, &call_id).await;
        assert_eq!(event["error_type"], "condition_error", "{event}");
    }
}

#[tokio::test]
async fn explain_shows_the_cost_and_refuses_a_call_the_quota_has_no_room_for() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    assert_eq!(
        exec(&mut client, &acme, search(95)).await.status(),
        ToolStatus::Ok
    );
    let explain = |top_k: i64| {
        let request = acme.request(proto::ExplainToolRequest {
            call: Some(call(
                "search",
                &format!(r#"{{"top_k":{top_k},"query":"card 4111"}}"#),
            )),
            run_id: "run-1".into(),
            ..Default::default()
        });
        let mut client = client.clone();
        async move {
            client
                .explain_tool(request)
                .await
                .expect("ExplainTool")
                .into_inner()
        }
    };
    let fits = explain(5).await;
    assert!(fits.would_execute, "{fits:?}");
    assert_eq!(fits.conditions.len(), 1, "{fits:?}");
    let cost = &fits.conditions[0];
    assert_eq!(
        (
            cost.location.as_str(),
            cost.expression.as_str(),
            cost.cost,
            cost.error.as_str()
        ),
        ("search@1.rate_limit.cost", "int(args.top_k)", Some(5), ""),
    );
    // It read the arguments, and shows them as records do: the redacted query is not shown.
    let read: serde_json::Value = serde_json::from_str(&cost.variables_json).unwrap();
    assert_eq!(
        read,
        serde_json::json!({"args": {"top_k": 5, "query": "[redacted]"}})
    );
    let stage = fits
        .stages
        .iter()
        .find(|s| s.stage == "rate_limit")
        .expect("rate_limit");
    assert!(
        stage
            .detail
            .contains("5 cells of the tool quota 100/h (5 left now)"),
        "{stage:?}"
    );
    // Six do not fit: explain says what execution would, consuming nothing.
    let over = explain(6).await;
    let decision = over.decision.expect("decision");
    assert_eq!(
        (decision.status(), decision.error_type.as_str()),
        (ToolStatus::RateLimited, "rate_limited"),
        "{decision:?}"
    );
    let never = explain(500).await.decision.expect("decision");
    assert_eq!(never.error_type, "cost_over_burst", "{never:?}");
    // Nothing was consumed by explaining.
    assert_eq!(
        exec(&mut client, &acme, search(5)).await.status(),
        ToolStatus::Ok
    );
}

#[tokio::test]
async fn three_sidecars_share_a_cost_weighted_quota_exactly() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.yaml");
    let yaml = CATALOG.replacen(
        "version: 1\n",
        &format!(
            "version: 1\n{}audit: {{ sink: none }}\n",
            redis_state(&redis.url())
        ),
        1,
    );
    std::fs::write(&path, yaml).unwrap();
    let path = path.display().to_string();
    let sidecars: Vec<_> = (0..3).map(|_| spawn(&["--config", &path])).collect();
    // 60 callers, 20 on each sidecar on connections of their own, all at once, each asking
    // for 7 cells: exactly 14 fit into 100 (98), whichever sidecar they came through.
    let mut callers = Vec::new();
    for sidecar in &sidecars {
        for _ in 0..20 {
            callers.push(tools(sidecar).await);
        }
    }
    let results = join_all(
        callers
            .into_iter()
            .map(|mut client| async move { exec(&mut client, &who("acme"), search(7)).await }),
    )
    .await;
    let statuses: Vec<_> = results.iter().map(|r| r.status()).collect();
    let admitted = statuses.iter().filter(|s| **s == ToolStatus::Ok).count();
    let limited = statuses
        .iter()
        .filter(|s| **s == ToolStatus::RateLimited)
        .count();
    assert_eq!((admitted, limited), (14, 46), "{statuses:?}");
    // The two cells left are taken through another sidecar; then none is left anywhere.
    let mut b = tools(&sidecars[1]).await;
    assert_eq!(
        exec(&mut b, &who("acme"), search(2)).await.status(),
        ToolStatus::Ok
    );
    let mut c =
        toolgate::proto::tool_gate_client::ToolGateClient::new(connect(&sidecars[2].addr).await);
    let none_left = exec(&mut c, &who("acme"), search(1)).await;
    assert_eq!(none_left.status(), ToolStatus::RateLimited, "{none_left:?}");
    // The tenant's overall quota counted calls, one each: 15 of 1000, not 100 cells.
    let key = "toolgate:{acme}:rl:tenant:1000/3600s/1000";
    let tat = redis.command(&["GET", key]).await;
    let redis::Value::BulkString(tat) = tat else {
        panic!("no tenant quota state: {tat:?}");
    };
    let tat: f64 = String::from_utf8_lossy(&tat).parse().unwrap();
    let time = redis.command(&["TIME"]).await;
    let redis::Value::Array(time) = time else {
        panic!("{time:?}")
    };
    let seconds = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).parse::<f64>().unwrap(),
        other => panic!("{other:?}"),
    };
    let now_us = seconds(&time[0]) * 1e6 + seconds(&time[1]);
    // Each admitted call moved the tenant's TAT one emission (3.6 s), the refused ones none:
    // 15 admitted, so up to 15 × 3.6 s ahead of now (less the seconds the test took).
    let ahead_calls = (tat - now_us) / 3_600_000.0;
    assert!(
        (14.0..=15.0).contains(&ahead_calls),
        "{ahead_calls} calls ahead"
    );
}

#[test]
fn a_cost_is_checked_at_load_and_only_a_tools_quota_has_one() {
    let load = |yaml: &str| {
        toolgate::config::Config::from_yaml(
            yaml,
            "catalog.yaml",
            std::path::Path::new("."),
            &toolgate::settings::Env::default(),
        )
        .map(|_| ())
        .map_err(|err| err.to_string())
    };
    assert_eq!(load(CATALOG), Ok(()));
    let bad = load(&CATALOG.replace("int(args.top_k)", "int(secret.top_k)")).unwrap_err();
    assert!(
        bad.contains("tools[0].rate_limit.cost") && bad.contains("unknown variable \"secret\""),
        "{bad}"
    );
    let tenant = load(&CATALOG.replace(
        "acme: { rate_limit: 1000/h }",
        "acme: { rate_limit: { quota: 1000/h, cost: \"1\" } }",
    ))
    .unwrap_err();
    assert!(
        tenant.contains("tenants.acme.rate_limit.cost")
            && tenant.contains("only a tool's rate limit has a cost"),
        "{tenant}"
    );
    // A misspelt key is not silently a quota without its cost.
    let typo = load(&CATALOG.replace("cost: \"int(args.top_k)\"", "costs: \"2\"")).unwrap_err();
    assert!(typo.contains("rate_limit"), "{typo}");
}
