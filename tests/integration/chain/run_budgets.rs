//! Budgets for a whole run and for a caller's day (issue 57), through real servers: a run spends
//! calls, cost and one tool's calls until each runs out (`DENIED`/`run_budget_exhausted`, not
//! retryable, naming the budget and what was used); what never reached its backend (a refusal,
//! a pending approval, an idempotent replay) spends nothing; the caller's day holds across run
//! ids; explain says what is left; metrics count each exhaustion; with Redis, two sidecars
//! racing for a run's last call give it to exactly one, and an outage fails closed.

use toolgate::proto::{self, ToolStatus};

use crate::support::{
    Backend, TestServer, bob, call, explain_in_run, http_get, metric, on_both_backends, who,
};

const CATALOG: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
budgets:
  run: { max_calls: 6, max_cost: 20, max_calls_per_tool: { send_email: 2 } }
  caller_daily: { max_calls: 9 }
tools:
  - { name: search, description: Searches., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object, properties: { k: { type: integer } } }, rate_limit: { quota: 1000/h, cost: "has(args.k) ? args.k : 1" } }
  - { name: send_email, description: Sends an e-mail., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object, properties: { to: { type: string } }, additionalProperties: false } }
  - { name: refund_order, description: Refunds an order., risk_level: write_confirmed, executor: { builtin: echo_arguments }, input_schema: { type: object } }
"#;

/// `c` by alice in `run`.
async fn in_run(server: &TestServer, run: &str, c: proto::ToolCall) -> proto::ToolResult {
    let mut request = crate::support::execute_request(c);
    request.run_id = run.into();
    server
        .client()
        .await
        .execute_tool(who("acme").subject("alice").request(request))
        .await
        .expect("ExecuteTool answers")
        .into_inner()
        .result
        .expect("a result")
}

async fn run_call(server: &TestServer, run: &str, tool: &str, args: &str) -> proto::ToolResult {
    in_run(server, run, call(tool, args)).await
}

fn refused(r: &proto::ToolResult) -> (ToolStatus, &str, bool) {
    (r.status(), r.error_type.as_str(), r.retryable)
}

const EXHAUSTED: (ToolStatus, &str, bool) = (ToolStatus::Denied, "run_budget_exhausted", false);

fn rate_limit_detail(explained: &proto::ExplainToolResponse) -> String {
    explained
        .stages
        .iter()
        .find(|s| s.stage == "rate_limit")
        .map(|s| s.detail.clone())
        .expect("a rate_limit stage")
}

async fn a_run_spends_its_budget_until_each_limit_runs_out(backend: Backend) {
    let server = TestServer::start_on(backend, CATALOG).await;
    // A call refused before its backend (schema) spends nothing.
    let r = run_call(&server, "r1", "send_email", r#"{"cc":"x"}"#).await;
    assert_eq!(r.status(), ToolStatus::InvalidArguments, "{r:?}");
    for _ in 0..2 {
        let r = run_call(&server, "r1", "send_email", "{}").await;
        assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    }
    let r = run_call(&server, "r1", "send_email", "{}").await;
    assert_eq!(refused(&r), EXHAUSTED, "{r:?}");
    assert_eq!(r.refused_by, "rate_limit");
    assert!(
        r.error_message.contains("run \"r1\"")
            && r.error_message.contains("budgets.run")
            && r.error_message
                .contains("2 of its 2 calls of send_email used"),
        "{}",
        r.error_message
    );
    assert!(
        r.model_text.contains("run_budget_exhausted"),
        "{}",
        r.model_text
    );
    // Another run of the same person has its own budget.
    let r = run_call(&server, "r2", "send_email", "{}").await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    // Cost: search costs k; the run has spent 2 (two sends) of 20.
    let r = run_call(&server, "r1", "search", r#"{"k":15}"#).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    let r = run_call(&server, "r1", "search", r#"{"k":4}"#).await;
    assert_eq!(refused(&r), EXHAUSTED, "{r:?}");
    assert!(
        r.error_message.contains("17 of its 20 units of cost used"),
        "{}",
        r.error_message
    );
    // Explain says what is left, consuming nothing.
    let explained = explain_in_run(&server, "r1", "search").await;
    let detail = rate_limit_detail(&explained);
    assert!(
        detail.contains("run \"r1\": 3 of 6 calls, 3 of 20 units of cost left")
            && detail.contains("this caller's day (UTC): 5 of 9 calls left"),
        "{detail}"
    );
    // An approval waited for spends nothing; the approved call spends once.
    let r = run_call(&server, "r1", "refund_order", r#"{"order":"o-1"}"#).await;
    assert_eq!(r.error_type, "approval_required", "{r:?}");
    let explained = explain_in_run(&server, "r1", "search").await;
    assert!(
        rate_limit_detail(&explained).contains("3 of 6 calls"),
        "{}",
        rate_limit_detail(&explained)
    );
    let mut approvals = server.approvals().await;
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: r.approval_id.clone(),
            decision: proto::ApprovalDecision::Approve as i32,
            reason: "ok".into(),
        }))
        .await
        .expect("bob approves");
    let mut again = call("refund_order", r#"{"order":"o-1"}"#);
    again.approval_id = r.approval_id.clone();
    again.idempotency_key = "refund-o-1".into();
    let first = in_run(&server, "r1", again.clone()).await;
    assert_eq!(first.status(), ToolStatus::Ok, "{first:?}");
    // Its replay reaches no backend: it spends nothing either.
    let replay = in_run(&server, "r1", again).await;
    assert!(replay.idempotent_replay, "{replay:?}");
    // r1 has spent 4 calls (2 sends, 1 search, 1 refund): 2 are left.
    for _ in 0..2 {
        let r = run_call(&server, "r1", "search", "{}").await;
        assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    }
    let r = run_call(&server, "r1", "search", "{}").await;
    assert_eq!(refused(&r), EXHAUSTED, "{r:?}");
    assert!(
        r.error_message.contains("6 of its 6 calls used"),
        "{}",
        r.error_message
    );
    // The caller's day: 7 calls so far (6 in r1, 1 in r2); two more in a new run, then none,
    // whatever run id the client sends.
    for run in ["r3", "r4"] {
        let r = run_call(&server, run, "search", "{}").await;
        assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    }
    for run in ["r5", ""] {
        let r = run_call(&server, run, "search", "{}").await;
        assert_eq!(refused(&r), EXHAUSTED, "{r:?}");
        assert!(
            r.error_message.contains("budgets.caller_daily")
                && r.error_message.contains("9 of its 9 calls used"),
            "{}",
            r.error_message
        );
    }
    // Another person is untouched.
    let mut client = server.client().await;
    let r = crate::support::exec(
        &mut client,
        &who("acme").subject("carol"),
        call("search", "{}"),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    // Each exhaustion is counted by budget and limit.
    let (_, text) = http_get(server.admin_addr(), "/metrics").await;
    let count = |budget, limit| {
        metric(
            &text,
            "toolgate_run_budget_exhausted_total",
            &[("budget", budget), ("limit", limit)],
        )
    };
    assert_eq!(count("run", "tool_calls"), 1.0, "{text}");
    assert_eq!(count("run", "cost"), 1.0);
    assert_eq!(count("run", "calls"), 1.0);
    assert_eq!(count("caller_daily", "calls"), 2.0);
    server.stop().await;
}

on_both_backends!(a_run_spends_its_budget_until_each_limit_runs_out);

/// Two sidecars on one Redis, twenty calls of one run at once, five calls in its budget:
/// exactly five run, wherever they land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_racing_for_a_runs_last_calls_give_each_to_exactly_one() {
    let redis = crate::redis_server::RedisServer::start();
    let yaml = CATALOG.replace("max_calls: 6,", "max_calls: 5,").replacen(
        "version: 1\n",
        &format!("version: 1\n{}", crate::support::redis_state(&redis.url())),
        1,
    );
    let (a, b) = (
        TestServer::start(&yaml).await,
        TestServer::start(&yaml).await,
    );
    let calls = (0..20).map(|i| {
        let sidecar = if i % 2 == 0 { &a } else { &b };
        run_call(sidecar, "race", "search", "{}")
    });
    let results = futures::future::join_all(calls).await;
    let ok = results
        .iter()
        .filter(|r| r.status() == ToolStatus::Ok)
        .count();
    let exhausted = results
        .iter()
        .filter(|r| r.error_type == "run_budget_exhausted")
        .count();
    assert_eq!((ok, exhausted), (5, 15), "{results:?}");
    a.stop().await;
    b.stop().await;
}

/// Without Redis a budget cannot be read: the call does not run (fail closed, retryable), even
/// for a tool with no quota of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_a_budgeted_call_fails_closed() {
    let mut server = TestServer::start_on(Backend::Redis, CATALOG).await;
    let r = run_call(&server, "r1", "send_email", "{}").await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    server.redis.as_mut().expect("its redis").kill();
    let r = run_call(&server, "r1", "send_email", "{}").await;
    assert_eq!(
        refused(&r),
        (ToolStatus::Unavailable, "state_unavailable", true),
        "{r:?}"
    );
    assert!(r.error_message.contains("budgets"), "{}", r.error_message);
    server.stop().await;
}
