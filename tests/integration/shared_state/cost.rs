//! What the shared state costs Redis per call, for 50 and 1,000 tenants.

use super::*;

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
