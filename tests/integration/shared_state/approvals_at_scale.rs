//! Approvals in Redis at scale (issue 25, item 3): what one approval request costs Redis stays
//! the same whether its tenant holds ten approvals or a thousand, so a busy tenant cannot take
//! Redis from a quiet one; and approvals stored by the previous layout are adopted, not lost.
//!
//! Cost is what Redis itself counts: the commands a script runs (`INFO commandstats` counts
//! those a script calls too), and the median time of a script as `SLOWLOG` records it — never
//! a wall clock of ours.

use futures::future::join_all;
use toolgate::proto::{self, ApprovalDecision, ToolStatus};

use crate::support::{RedisServer, STAGES, TestServer, Who, call, exec, redis_state, who};

fn bob(tenant: &str) -> Who {
    who(tenant).subject("bob").scopes("toolgate:approve")
}

fn catalog(redis: &RedisServer, approvals: &str) -> String {
    STAGES.replacen(
        "version: 1\n",
        &format!(
            "version: 1\n{}approvals: {approvals}\n",
            redis_state(&redis.url())
        ),
        1,
    )
}

/// `INFO commandstats` as (command, calls, usec).
async fn commandstats(redis: &RedisServer) -> Vec<(String, u64, u64)> {
    let info = crate::support::info_text(redis.command(&["INFO", "commandstats"]).await);
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> u64 {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            Some((name.to_owned(), field("calls"), field("usec")))
        })
        .collect()
}

/// What `n` approval requests of `tenant` cost Redis: the commands its scripts ran per request,
/// and the median time of one script (µs).
async fn cost_of_requests(
    server: &TestServer,
    redis: &RedisServer,
    tenant: &str,
    n: usize,
) -> (f64, u64) {
    redis.command(&["CONFIG", "RESETSTAT"]).await;
    redis.command(&["SLOWLOG", "RESET"]).await;
    let mut client = server.client().await;
    for i in 0..n {
        let asked = exec(
            &mut client,
            &who(tenant),
            call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
        )
        .await;
        assert_eq!(asked.status(), ToolStatus::ApprovalRequired, "{asked:?}");
    }
    let stats = commandstats(redis).await;
    let scripts: u64 = stats
        .iter()
        .filter(|(name, ..)| name == "evalsha")
        .map(|(_, calls, _)| calls)
        .sum();
    assert_eq!(scripts, n as u64, "one script per request: {stats:?}");
    let inner: u64 = stats
        .iter()
        .filter(|(name, ..)| {
            !matches!(
                name.as_str(),
                // Ours, the health check's clock samples, and the emergency denies' reconcile
                // reads (every few seconds, whatever the calls).
                "evalsha" | "config|resetstat" | "slowlog|reset" | "time" | "hvals"
            )
        })
        .map(|(_, calls, _)| calls)
        .sum();
    let mut times: Vec<u64> = match redis.command(&["SLOWLOG", "GET", "-1"]).await {
        redis::Value::Array(entries) => entries
            .into_iter()
            .filter_map(|entry| match entry {
                redis::Value::Array(fields) => {
                    let is_script = matches!(&fields.get(3), Some(redis::Value::Array(args))
                        if args.first() == Some(&redis::Value::BulkString(b"EVALSHA".to_vec())));
                    match (is_script, fields.get(2)) {
                        (true, Some(redis::Value::Int(us))) => Some(*us as u64),
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect(),
        other => panic!("SLOWLOG answered {other:?}"),
    };
    assert_eq!(times.len(), n, "every script logged");
    times.sort_unstable();
    (inner as f64 / n as f64, times[n / 2])
}

/// Adds `count` approvals to `tenant`, all rejected (finished), 50 requests at a time.
async fn fill_with_finished(server: &TestServer, tenant: &str, count: usize) {
    let client = server.client().await;
    for chunk in 0..count.div_ceil(50) {
        let asked = join_all((0..50).map(|i| {
            let mut client = client.clone();
            async move {
                exec(
                    &mut client,
                    &who(tenant),
                    call("approve_me", &format!(r#"{{"fill":{}}}"#, chunk * 50 + i)),
                )
                .await
            }
        }))
        .await;
        let mut approvals = server.approvals().await;
        for result in asked {
            assert_eq!(result.status(), ToolStatus::ApprovalRequired, "{result:?}");
            approvals
                .decide_approval(bob(tenant).request(proto::DecideApprovalRequest {
                    approval_id: result.approval_id,
                    decision: ApprovalDecision::Reject as i32,
                    reason: "no".into(),
                }))
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn an_approval_request_costs_redis_the_same_at_ten_approvals_and_at_a_thousand() {
    let redis = RedisServer::start_with(&[
        "--slowlog-log-slower-than",
        "0",
        // Commands a script calls are logged too (Redis 7).
        "--slowlog-max-len",
        "100000",
    ]);
    let server = TestServer::start(&catalog(
        &redis,
        "{ ttl: 1h, max_per_tenant: 1000, max_bytes_per_tenant: 16777216 }",
    ))
    .await;
    // Scripts loaded; acme holds ten finished approvals.
    fill_with_finished(&server, "acme", 10).await;
    let (few_commands, few_us) = cost_of_requests(&server, &redis, "acme", 20).await;
    // acme at its budget of a thousand, every new request making room by forgetting its
    // oldest finished one.
    fill_with_finished(&server, "acme", 1000).await;
    let (many_commands, many_us) = cost_of_requests(&server, &redis, "acme", 40).await;
    println!(
        "per request: {few_commands:.1} commands, {few_us} µs at ~20 approvals; {many_commands:.1} commands, {many_us} µs at 1,000"
    );
    // Counted work is flat (a request that evicts runs a few more), and far from the thousand
    // entries the old layout read each time.
    assert!(
        many_commands <= few_commands * 1.5 + 20.0,
        "{few_commands} -> {many_commands} commands per request"
    );
    assert!(
        many_commands < 150.0,
        "{many_commands} commands per request"
    );
    // Redis's own median time per request, with a generous factor for a noisy machine.
    assert!(
        many_us <= few_us.max(20) * 5,
        "{few_us} µs -> {many_us} µs per request"
    );
    // Meanwhile a quiet tenant's quota checks cost what they cost (the old layout's requests at
    // a thousand approvals each kept Redis busy for milliseconds), and go through.
    let mut client = server.client().await;
    for _ in 0..5 {
        let quiet = exec(&mut client, &who("globex"), call("limited", "{}")).await;
        assert_eq!(quiet.status(), ToolStatus::Ok, "{quiet:?}");
    }
    server.stop().await;
}

/// Rewrites `tenant`'s approvals into the layout before this one: one `index` of every
/// approval, no sets, totals or due times, and the hash without `member` and `forget`.
async fn into_the_previous_layout(redis: &RedisServer, tenant: &str) {
    let prefix = format!("toolgate:{{{tenant}}}:apr:");
    let keys = match redis.command(&["KEYS", &format!("{prefix}apr_*")]).await {
        redis::Value::Array(keys) => keys,
        other => panic!("KEYS answered {other:?}"),
    };
    for key in keys {
        let redis::Value::BulkString(key) = key else {
            panic!("{key:?}")
        };
        let key = String::from_utf8(key).unwrap();
        let field = |value: redis::Value| match value {
            redis::Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
            other => panic!("{other:?}"),
        };
        let member = field(redis.command(&["HGET", &key, "member"]).await);
        let expires: i64 = field(redis.command(&["HGET", &key, "expires"]).await)
            .parse()
            .unwrap();
        let ttl = expires
            - field(redis.command(&["HGET", &key, "created"]).await)
                .parse::<i64>()
                .unwrap();
        redis.command(&["HDEL", &key, "member", "forget"]).await;
        // The previous layout kept a hash for one TTL after its expiry, and no longer.
        redis
            .command(&["PEXPIREAT", &key, &(expires + ttl).to_string()])
            .await;
        redis
            .command(&["ZADD", &format!("{prefix}index"), "0", &member])
            .await;
    }
    for rest in [
        "due",
        "sizes",
        "usage",
        "st:pending",
        "st:approved",
        "st:rejected",
        "st:used",
        "st:expired",
        "st:invalidated",
    ] {
        redis.command(&["DEL", &format!("{prefix}{rest}")]).await;
    }
}

#[tokio::test]
async fn approvals_stored_by_the_previous_layout_are_adopted_with_their_budget() {
    let redis = RedisServer::start();
    let server = TestServer::start(&catalog(&redis, "{ max_per_tenant: 3 }")).await;
    let mut client = server.client().await;
    let alice = who("acme");
    let mut ids = Vec::new();
    for i in 0..3 {
        let asked = exec(
            &mut client,
            &alice,
            call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
        )
        .await;
        ids.push(asked.approval_id);
    }
    let mut approvals = server.approvals().await;
    approvals
        .decide_approval(bob("acme").request(proto::DecideApprovalRequest {
            approval_id: ids[1].clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: String::new(),
        }))
        .await
        .unwrap();
    into_the_previous_layout(&redis, "acme").await;
    // A reason written before reasons were bounded is listed cut to 1 KiB.
    let key = format!("toolgate:{{acme}}:apr:{}", ids[2]);
    let long = "x".repeat(3 << 20);
    redis
        .command(&["HSET", &key, "state", "rejected", "reason", &long])
        .await;
    // Listed in their order, each state from its own set once adopted.
    let list = |state: proto::ApprovalState| {
        let mut approvals = approvals.clone();
        async move {
            approvals
                .list_approvals(bob("acme").request(proto::ListApprovalsRequest {
                    state: state as i32,
                    ..Default::default()
                }))
                .await
                .unwrap()
                .into_inner()
                .approvals
        }
    };
    let pending = list(proto::ApprovalState::Pending).await;
    assert_eq!(
        pending.iter().map(|a| &a.approval_id).collect::<Vec<_>>(),
        [&ids[0]]
    );
    let rejected = list(proto::ApprovalState::Rejected).await;
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason.len(), 1024);
    // They count against the tenant's budget: two open ones and a finished one leave room for
    // one new approval, by forgetting the finished one.
    let fourth = exec(&mut client, &alice, call("approve_me", r#"{"amount":3}"#)).await;
    assert_eq!(fourth.status(), ToolStatus::ApprovalRequired, "{fourth:?}");
    let full = exec(&mut client, &alice, call("approve_me", r#"{"amount":4}"#)).await;
    assert_eq!(full.error_type, "overloaded", "{full:?}");
    assert!(list(proto::ApprovalState::Rejected).await.is_empty());
    // The approved one of the previous layout is redeemed once.
    let mut redeem = call("approve_me", r#"{"amount":1}"#);
    redeem.approval_id = ids[1].clone();
    let paid = exec(&mut client, &alice, redeem.clone()).await;
    assert_eq!(paid.status(), ToolStatus::Ok, "{paid:?}");
    let again = exec(&mut client, &alice, redeem).await;
    assert_eq!(again.error_type, "approval_already_used", "{again:?}");
    // The old index is gone.
    assert_eq!(
        redis
            .command(&["EXISTS", "toolgate:{acme}:apr:index"])
            .await,
        redis::Value::Int(0)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_reload_invalidates_every_open_approval_however_many() {
    let server = TestServer::start_file_on(crate::support::Backend::Redis, STAGES).await;
    let client = server.client().await;
    // More open approvals than one invalidation script handles, pending and approved.
    let asked = join_all((0..150).map(|i| {
        let mut client = client.clone();
        async move {
            exec(
                &mut client,
                &who("acme"),
                call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
            )
            .await
            .approval_id
        }
    }))
    .await;
    let mut approvals = server.approvals().await;
    for id in &asked[..70] {
        approvals
            .decide_approval(bob("acme").request(proto::DecideApprovalRequest {
                approval_id: id.clone(),
                decision: ApprovalDecision::Approve as i32,
                reason: String::new(),
            }))
            .await
            .unwrap();
    }
    let changed = STAGES.replace(
        "description: Needs an approval.",
        "description: Needs an approval (changed).",
    );
    server.write_catalog(&server.catalog_file(), &changed);
    server.reload().await.unwrap();
    let mut invalidated = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = approvals
            .list_approvals(bob("acme").request(proto::ListApprovalsRequest {
                state: proto::ApprovalState::Invalidated as i32,
                page_size: 200,
                page_token: token.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        invalidated.extend(page.approvals.into_iter().map(|a| a.approval_id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let mut expected = asked.clone();
    expected.sort();
    invalidated.sort();
    assert_eq!(invalidated, expected);
    server.stop().await;
}

/// Redis's own time (µs) of each script it ran since the last `SLOWLOG RESET`, by whether its
/// keys are `tenant`'s: (the tenant's, everyone else's).
async fn script_times(redis: &RedisServer, tenant: &str) -> (Vec<u64>, Vec<u64>) {
    let tag = format!("{{{tenant}}}");
    let (mut ours, mut others) = (Vec::new(), Vec::new());
    let redis::Value::Array(entries) = redis.command(&["SLOWLOG", "GET", "-1"]).await else {
        panic!("SLOWLOG answered otherwise");
    };
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        if args.first() != Some(&redis::Value::BulkString(b"EVALSHA".to_vec())) {
            continue;
        }
        let names_tenant = args.iter().any(|arg| {
            matches!(arg, redis::Value::BulkString(bytes) if String::from_utf8_lossy(bytes).contains(&tag))
        });
        match names_tenant {
            true => ours.push(*us as u64),
            false => others.push(*us as u64),
        }
    }
    ours.sort_unstable();
    others.sort_unstable();
    (ours, others)
}

#[tokio::test]
async fn a_tenant_flooding_approval_requests_leaves_a_quiet_tenant_unaffected() {
    let redis = RedisServer::start_with(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "100000",
    ]);
    let yaml = catalog(
        &redis,
        "{ ttl: 1h, max_per_tenant: 1000, max_bytes_per_tenant: 16777216 }",
    )
    .replace(
        "tools:\n",
        "tools:\n  - { name: counted, description: Echo with a quota., risk_level: read_only, rate_limit: 100000/min, executor: { builtin: echo }, input_schema: { type: object, properties: { text: { type: string } } } }\n",
    );
    let server = TestServer::start(&yaml).await;
    // acme at its budget: each new request makes room by forgetting its oldest finished one.
    fill_with_finished(&server, "acme", 1000).await;
    redis.command(&["SLOWLOG", "RESET"]).await;
    let client = server.client().await;
    let quiet = |n: usize| {
        let client = client.clone();
        async move {
            let mut client = client;
            let mut statuses = Vec::new();
            for i in 0..n {
                let r = exec(
                    &mut client,
                    &who("globex"),
                    call("counted", &format!(r#"{{"text":"{i}"}}"#)),
                )
                .await;
                statuses.push((r.status(), r.error_type));
            }
            statuses
        }
    };
    // At the same time: acme's 240 requests from eight clients, globex's 100 quota checks.
    let flood = join_all((0..8).map(|c| {
        let mut client = client.clone();
        async move {
            for i in 0..30 {
                let asked = exec(
                    &mut client,
                    &who("acme"),
                    call("approve_me", &format!(r#"{{"flood":{}}}"#, c * 30 + i)),
                )
                .await;
                assert_eq!(asked.status(), ToolStatus::ApprovalRequired, "{asked:?}");
            }
        }
    }));
    let (_, statuses) = tokio::join!(flood, quiet(100));
    assert!(
        statuses.iter().all(|(status, _)| *status == ToolStatus::Ok),
        "{statuses:?}"
    );
    let (acme, globex) = script_times(&redis, "acme").await;
    // SLOWLOG keeps the latest 100,000 entries (the scripts' own commands are logged too).
    assert!(!acme.is_empty() && !globex.is_empty());
    // What the quiet tenant's scripts waited behind: acme's, each short (the old layout's took
    // 2-4 ms each at a thousand approvals, read from SLOWLOG the same way).
    let p90 = acme[acme.len() * 9 / 10];
    println!(
        "acme's requests: median {} µs, p90 {p90} µs; globex's quota checks: median {} µs",
        acme[acme.len() / 2],
        globex[globex.len() / 2]
    );
    assert!(
        p90 < 1000,
        "acme's approval requests took {p90} µs of Redis (p90)"
    );
    // Every one of globex's quotas was decided by Redis, none locally or refused.
    let (_, page) = crate::support::http_get(server.admin_addr(), "/metrics").await;
    assert_eq!(
        crate::support::metric(&page, "toolgate_rate_limit_local_decisions_total", &[]),
        0.0
    );
    assert_eq!(
        crate::support::metric(&page, "toolgate_state_failures_total", &[]),
        0.0,
        "{page}"
    );
    server.stop().await;
}
