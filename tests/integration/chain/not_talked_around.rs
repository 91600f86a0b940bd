//! The boundary cannot be talked around (issue 11, items 10–18): approvals are used only by a
//! call that reaches its backend and carry exactly the approved arguments; idempotency keys belong
//! to their caller, keep only final outcomes and are bounded per tenant; agent policy applies
//! whatever the agent claims to be; both quotas or neither; override attempts are audited even
//! when the schema refuses first.

use std::time::Duration;

use serde_json::Value;
use toolgate::proto::{self, ApprovalDecision, ToolStatus};

use crate::support::bob;
use crate::support::{
    Backend, STAGES, TestServer, call, exec, on_both_backends, refusing_port, visible, who,
};

on_both_backends!(
    an_approval_is_used_only_by_a_call_that_reaches_the_backend,
    a_keyed_repeat_of_an_approved_call_replays_instead_of_being_refused,
    the_backend_receives_exactly_the_arguments_that_were_approved,
    another_subject_never_receives_a_stored_result,
    only_final_outcomes_are_kept_for_replays,
    one_tenant_cannot_evict_another_tenants_idempotency_entries,
    a_call_refused_by_the_tenant_quota_consumes_no_tool_quota,
    a_call_refused_by_the_tool_quota_consumes_no_tenant_quota,
);

async fn approve(server: &TestServer, id: &str) {
    let mut approvals = server.approvals().await;
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.into(),
            decision: ApprovalDecision::Approve as i32,
            reason: "ok".into(),
        }))
        .await
        .expect("approved");
}

async fn approval_state(server: &TestServer, id: &str) -> proto::ApprovalState {
    let mut approvals = server.approvals().await;
    approvals
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: id.into(),
        }))
        .await
        .expect("GetApproval")
        .into_inner()
        .approval
        .expect("an approval")
        .state()
}

fn with(mut c: proto::ToolCall, approval_id: &str, key: &str) -> proto::ToolCall {
    c.approval_id = approval_id.into();
    c.idempotency_key = key.into();
    c
}

/// A catalog whose approval-needing tool posts to an HTTP upstream on loopback.
fn http_approval_catalog(port: u16) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
upstreams:
  local:
    url: http://127.0.0.1:{port}/pay
    allow_schemes: [http]
    allow_private_addresses: true
tools:
  - name: pay
    description: Pays.
    risk_level: write_confirmed
    executor: {{ http: {{ upstream: local }} }}
    input_schema: {{ type: object, properties: {{ amount: {{ type: integer }} }} }}
"#
    )
}

async fn an_approval_is_used_only_by_a_call_that_reaches_the_backend(backend: Backend) {
    // A port with nothing listening: the first redemption cannot reach the backend.
    let (reserved, addr) = refusing_port();
    let port = addr.port();
    let server = TestServer::start_on(backend, &http_approval_catalog(port)).await;
    let mut client = server.client().await;
    let alice = who("acme").subject("alice");
    let args = r#"{"amount":5}"#;
    let first = exec(&mut client, &alice, call("pay", args)).await;
    assert_eq!(first.status(), ToolStatus::ApprovalRequired, "{first:?}");
    let id = first.approval_id;
    approve(&server, &id).await;

    let unreachable = exec(&mut client, &alice, with(call("pay", args), &id, "")).await;
    assert_eq!(
        (
            unreachable.status(),
            unreachable.error_type.as_str(),
            unreachable.retryable
        ),
        (ToolStatus::Error, "upstream_unavailable", true),
        "{unreachable:?}"
    );
    assert_eq!(
        approval_state(&server, &id).await,
        proto::ApprovalState::Approved,
        "a call that never reached the backend must not use the approval up"
    );

    // The backend comes up: the same approval now runs the call, once.
    let listener = reserved.listen(64).unwrap();
    let paid = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = paid.clone();
    let app = axum::Router::new().route(
        "/pay",
        axum::routing::post(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { r#"{"paid":true}"# }
        }),
    );
    let upstream = tokio::spawn(async move { axum::serve(listener, app).await });
    let ok = exec(&mut client, &alice, with(call("pay", args), &id, "")).await;
    assert_eq!(ok.status(), ToolStatus::Ok, "{ok:?}");
    assert_eq!(
        approval_state(&server, &id).await,
        proto::ApprovalState::Used
    );
    let again = exec(&mut client, &alice, with(call("pay", args), &id, "")).await;
    assert_eq!(again.error_type, "approval_already_used", "{again:?}");
    assert_eq!(paid.load(std::sync::atomic::Ordering::SeqCst), 1);
    upstream.abort();
    server.stop().await;
}

async fn a_keyed_repeat_of_an_approved_call_replays_instead_of_being_refused(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let mut client = server.client().await;
    let alice = who("acme").subject("alice");
    let args = r#"{"order":"o-9","amount":3}"#;
    let id = exec(&mut client, &alice, call("approve_me", args))
        .await
        .approval_id;
    approve(&server, &id).await;
    let before = server.builtins().executions();
    let ran = exec(
        &mut client,
        &alice,
        with(call("approve_me", args), &id, "k-1"),
    )
    .await;
    assert_eq!(ran.status(), ToolStatus::Ok, "{ran:?}");
    // The client lost the answer and retries the very same call: it gets the result again.
    let replay = exec(
        &mut client,
        &alice,
        with(call("approve_me", args), &id, "k-1"),
    )
    .await;
    assert_eq!(
        (replay.status(), replay.idempotent_replay),
        (ToolStatus::Ok, true),
        "{replay:?}"
    );
    assert_eq!(replay.model_text, ran.model_text);
    assert_eq!(server.builtins().executions(), before + 1);
    // Without the key it is a second use, refused.
    let unkeyed = exec(&mut client, &alice, with(call("approve_me", args), &id, "")).await;
    assert_eq!(unkeyed.error_type, "approval_already_used");
    server.stop().await;
}

async fn the_backend_receives_exactly_the_arguments_that_were_approved(backend: Backend) {
    let server = TestServer::demo_on(backend).await;
    let mut client = server.client().await;
    let alice = who("acme").subject("alice");
    let requested = exec(
        &mut client,
        &alice,
        call(
            "refund_order",
            r#"{"order_id":"A-1001","amount_cents":2500}"#,
        ),
    )
    .await;
    approve(&server, &requested.approval_id).await;
    // The same value spelled as a float: the hash matches (rightly), and the refund must be for
    // 2500 cents, not for what a tool makes of 2500.0.
    let mut redeem = call(
        "refund_order",
        r#"{"amount_cents":2500.0,"order_id":"A-1001"}"#,
    );
    redeem.approval_id = requested.approval_id.clone();
    let refunded = exec(&mut client, &alice, redeem).await;
    assert_eq!(refunded.status(), ToolStatus::Ok, "{refunded:?}");
    let output: Value = serde_json::from_str(&refunded.model_text).unwrap();
    assert_eq!(output["amount_cents"], 2500, "{output}");
    server.stop().await;
}

async fn another_subject_never_receives_a_stored_result(backend: Backend) {
    let server = TestServer::demo_on(backend).await;
    let mut client = server.client().await;
    let writer = |subject: &str| {
        who("acme")
            .subject(subject)
            .scopes("tickets:read,tickets:write")
    };
    let mut create = call("create_ticket", r#"{"title":"printer on fire"}"#);
    create.idempotency_key = "shared-key".into();
    let alices = exec(&mut client, &writer("alice"), create.clone()).await;
    assert_eq!(alices.status(), ToolStatus::Ok, "{alices:?}");
    let mallorys = exec(&mut client, &writer("mallory"), create.clone()).await;
    assert_eq!(mallorys.status(), ToolStatus::Ok, "{mallorys:?}");
    assert!(
        !mallorys.idempotent_replay,
        "mallory got alice's stored result"
    );
    let ticket =
        |r: &proto::ToolResult| serde_json::from_str::<Value>(&r.model_text).unwrap()["id"].clone();
    assert_ne!(ticket(&alices), ticket(&mallorys));
    let again = exec(&mut client, &writer("alice"), create).await;
    assert!(again.idempotent_replay);
    assert_eq!(ticket(&again), ticket(&alices));
    server.stop().await;
}

async fn only_final_outcomes_are_kept_for_replays(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let mut client = server.client().await;
    let keyed = |tool: &str, key: &str| {
        let mut c = call(tool, r#"{"ms":5000}"#);
        c.idempotency_key = key.into();
        c
    };
    // A read-only tool's timeout is retryable: the key is released and the retry runs.
    let first = exec(&mut client, &who("acme"), keyed("slow", "read-key")).await;
    assert_eq!(
        (first.status(), first.retryable),
        (ToolStatus::Timeout, true)
    );
    let runs = server.builtins().executions();
    let retry = exec(&mut client, &who("acme"), keyed("slow", "read-key")).await;
    assert_eq!(retry.status(), ToolStatus::Timeout);
    assert!(!retry.idempotent_replay, "a retryable timeout was replayed");
    assert_eq!(
        server.builtins().executions(),
        runs + 1,
        "the retry did not run"
    );

    // A write's timeout leaves its outcome unknown: the key is kept, the retry cannot write twice.
    let write = exec(&mut client, &who("acme"), keyed("slow_write", "write-key")).await;
    assert_eq!(
        (write.status(), write.retryable),
        (ToolStatus::Timeout, false)
    );
    let runs = server.builtins().executions();
    let again = exec(&mut client, &who("acme"), keyed("slow_write", "write-key")).await;
    assert_eq!(
        (again.status(), again.idempotent_replay),
        (ToolStatus::Timeout, true)
    );
    assert!(
        again.error_message.contains("outcome is unknown"),
        "{again:?}"
    );
    assert_eq!(server.builtins().executions(), runs);
    server.stop().await;
}

async fn one_tenant_cannot_evict_another_tenants_idempotency_entries(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let mut client = server.client().await;
    let keyed = |text: &str, key: &str| {
        let mut c = call("echo", &format!(r#"{{"text":"{text}"}}"#));
        c.idempotency_key = key.into();
        c
    };
    let kept = exec(&mut client, &who("acme"), keyed("acme's", "acme-key")).await;
    assert_eq!(kept.status(), ToolStatus::Ok);
    // globex uses more keys than the whole sidecar used to keep (10,000), in batches.
    for batch in 0..80 {
        let calls: Vec<_> = (0..128)
            .map(|i| keyed("x", &format!("globex-{batch}-{i}")))
            .collect();
        let request = proto::ExecuteToolsRequest {
            calls,
            run_id: "flood".into(),
            ..Default::default()
        };
        let results = client
            .execute_tools(who("globex").request(request))
            .await
            .unwrap()
            .into_inner()
            .results;
        assert!(results.iter().all(|r| r.status() == ToolStatus::Ok));
    }
    let replay = exec(&mut client, &who("acme"), keyed("acme's", "acme-key")).await;
    assert!(
        replay.idempotent_replay,
        "acme's entry was evicted by globex"
    );
    assert_eq!(replay.model_text, "acme's");
    server.stop().await;
}

const AGENTS: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
agents:
  narrow-bot: { allow: [echo] }
tools:
  - { name: echo, description: Echo., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object, properties: { text: { type: string } } } }
  - { name: wide, description: Anything., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object } }
"#;

#[tokio::test]
async fn unknown_misspelt_or_missing_agents_get_the_default_policy_or_nothing() {
    let server = TestServer::start(AGENTS).await;
    let mut client = server.client().await;
    let known = who("acme").agent("narrow-bot");
    assert_eq!(visible(&mut client, &known).await, ["echo"]);
    for agent in ["Narrow-Bot", "other-bot", ""] {
        let caller = who("acme").agent(agent);
        assert!(
            visible(&mut client, &caller).await.is_empty(),
            "agent {agent:?} saw tools without a default policy"
        );
        let refused = exec(&mut client, &caller, call("wide", "{}")).await;
        assert_eq!(
            (refused.status(), refused.refused_by.as_str()),
            (ToolStatus::NotFound, "resolve"),
            "agent {agent:?}: {refused:?}"
        );
        // Not even the missing policy is told to the caller.
        assert!(!refused.error_message.contains("no default agent policy"));
    }
    server.stop().await;

    let with_default = AGENTS.replace(
        "  narrow-bot: { allow: [echo] }\n",
        "  narrow-bot: { allow: [echo] }\n  \"*\": { allow: [wide] }\n",
    );
    let server = TestServer::start(&with_default).await;
    let mut client = server.client().await;
    for agent in ["Narrow-Bot", "other-bot", ""] {
        assert_eq!(
            visible(&mut client, &who("acme").agent(agent)).await,
            ["wide"],
            "agent {agent:?}"
        );
    }
    server.stop().await;
}

async fn a_call_refused_by_the_tenant_quota_consumes_no_tool_quota(backend: Backend) {
    let catalog = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: { rate_limit: 4/h } }
tools:
  - { name: free, description: No quota of its own., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object } }
  - { name: metered, description: Two an hour., risk_level: read_only, rate_limit: 2/h, executor: { builtin: echo_arguments }, input_schema: { type: object } }
"#;
    let server = TestServer::start_on(backend, catalog).await;
    let mut client = server.client().await;
    let acme = who("acme");
    for _ in 0..3 {
        assert_eq!(
            exec(&mut client, &acme, call("free", "{}")).await.status(),
            ToolStatus::Ok
        );
    }
    assert_eq!(
        exec(&mut client, &acme, call("metered", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    // The tenant's 4/h is used up; these are refused by it and must not touch metered's 2/h.
    for _ in 0..3 {
        let refused = exec(&mut client, &acme, call("metered", "{}")).await;
        assert_eq!(refused.status(), ToolStatus::RateLimited);
        assert!(
            refused.error_message.contains("overall rate limit"),
            "refused by the wrong quota: {refused:?}"
        );
    }
    // What the quotas hold now, as ExplainTool will show it: metered's own quota still has
    // its second call.
    let state = server.boundary().catalog();
    let metered = state.catalog.resolve("metered", None, "acme").unwrap();
    let views = state
        .rate_limits
        .view(
            "acme",
            toolgate::boundary::quota_of(metered),
            state.catalog.tenants["acme"].rate_limit,
        )
        .await
        .unwrap();
    let remaining: Vec<(&str, u64)> = views.iter().map(|v| (v.scope, v.remaining)).collect();
    assert_eq!(remaining, [("tool", 1), ("tenant", 0)]);
    if backend == Backend::Redis {
        // Redis keeps its own time: an hour's quarter is not waited for.
        server.stop().await;
        return;
    }
    // A quarter of an hour gives the tenant one call back: metered still has its second.
    server.clock.advance(Duration::from_secs(15 * 60));
    let second = exec(&mut client, &acme, call("metered", "{}")).await;
    assert_eq!(second.status(), ToolStatus::Ok, "{second:?}");
    server.stop().await;
}

async fn a_call_refused_by_the_tool_quota_consumes_no_tenant_quota(backend: Backend) {
    let catalog = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: { rate_limit: 4/h } }
tools:
  - { name: free, description: No quota of its own., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object } }
  - { name: metered, description: Two an hour., risk_level: read_only, rate_limit: 2/h, executor: { builtin: echo_arguments }, input_schema: { type: object } }
"#;
    let server = TestServer::start_on(backend, catalog).await;
    let mut client = server.client().await;
    let acme = who("acme");
    for _ in 0..2 {
        let used = exec(&mut client, &acme, call("metered", "{}")).await;
        assert_eq!(used.status(), ToolStatus::Ok, "{used:?}");
    }
    // metered's 2/h is used up; these are refused by it and must not touch the tenant's 4/h,
    // which has two calls left.
    for _ in 0..3 {
        let refused = exec(&mut client, &acme, call("metered", "{}")).await;
        assert_eq!(refused.status(), ToolStatus::RateLimited);
        assert!(
            refused.error_message.contains("rate limit 2/h for metered"),
            "refused by the wrong quota: {refused:?}"
        );
    }
    let state = server.boundary().catalog();
    let metered = state.catalog.resolve("metered", None, "acme").unwrap();
    let views = state
        .rate_limits
        .view(
            "acme",
            toolgate::boundary::quota_of(metered),
            state.catalog.tenants["acme"].rate_limit,
        )
        .await
        .unwrap();
    let remaining: Vec<(&str, u64)> = views.iter().map(|v| (v.scope, v.remaining)).collect();
    assert_eq!(remaining, [("tool", 0), ("tenant", 2)]);
    // The tenant's two calls are there for another tool, and then it is used up.
    for _ in 0..2 {
        let other = exec(&mut client, &acme, call("free", "{}")).await;
        assert_eq!(other.status(), ToolStatus::Ok, "{other:?}");
    }
    let over = exec(&mut client, &acme, call("free", "{}")).await;
    assert!(
        over.status() == ToolStatus::RateLimited
            && over.error_message.contains("overall rate limit"),
        "{over:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_override_attempt_is_audited_even_when_the_schema_refuses_first() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let mut c = call("bound", r#"{"owner":"mallory","note":5}"#);
    c.call_id = "attack".into();
    let refused = exec(&mut client, &who("acme"), c).await;
    assert_eq!(
        (refused.status(), refused.refused_by.as_str()),
        (ToolStatus::InvalidArguments, "schema")
    );
    let event = server.wait_for_audit(|e| e["call_id"] == "attack").await;
    assert_eq!(
        event["bound_override_attempts"],
        serde_json::json!(["owner"])
    );
    server.stop().await;
}
