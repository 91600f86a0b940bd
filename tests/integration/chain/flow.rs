//! Run-level flow rules (issue 31 B), through real servers: the send is allowed after one read
//! and refused (`DENIED`/`flow_denied`, naming the rule, the labels and the calls that brought
//! them) after both, only in the run that read; a `require_approval` rule sends it through the
//! usual approval; a caller scope holds whatever run ids the client sends; audit events carry
//! the labels a call added; and with Redis, a run that reads on one sidecar cannot send from
//! another.

use serde_json::Value;
use toolgate::proto::{self, ToolStatus};

use crate::support::{Backend, TestServer, call, exec, explain_in_run, on_both_backends, who};

const CATALOG: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
flow:
  labels: [private_data, untrusted_content, external_send]
  rules:
    - { name: no_exfiltration, after: [private_data, untrusted_content], deny: [external_send] }
tools:
  - { name: rag_search, description: Searches the customer database., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object }, flow_labels: [private_data] }
  - { name: fetch_url, description: Fetches a web page., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object }, flow_labels: [untrusted_content] }
  - { name: send_email, description: Sends an e-mail., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object }, flow_labels: [external_send] }
  - { name: failing, description: Fails before it runs., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object, required: [x] }, flow_labels: [untrusted_content] }
"#;

/// A call of `tool` in `run`, with this call id.
async fn run_call(server: &TestServer, run: &str, id: &str, tool: &str) -> proto::ToolResult {
    let mut c = call(tool, "{}");
    c.call_id = id.into();
    in_run(server, run, c).await
}

/// `c`, by alice, in `run`.
async fn in_run(server: &TestServer, run: &str, c: proto::ToolCall) -> proto::ToolResult {
    let mut request = crate::support::execute_request(c);
    request.run_id = run.into();
    server
        .client()
        .await
        .execute_tool(who("acme").subject("alice").request(request))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap()
}

async fn send_after_both_reads_is_refused_only_in_that_run(backend: Backend) {
    let server = TestServer::start_on(backend, CATALOG).await;
    // A call refused before its backend adds nothing.
    let r = run_call(&server, "r1", "bad", "failing").await;
    assert_eq!(r.status(), ToolStatus::InvalidArguments, "{r:?}");
    assert_eq!(
        run_call(&server, "r1", "c1", "rag_search").await.status(),
        ToolStatus::Ok
    );
    let r = run_call(&server, "r1", "c2", "send_email").await;
    assert_eq!(
        r.status(),
        ToolStatus::Ok,
        "one read is not the attack: {r:?}"
    );
    assert_eq!(
        run_call(&server, "r1", "c3", "fetch_url").await.status(),
        ToolStatus::Ok
    );
    let r = run_call(&server, "r1", "c4", "send_email").await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Denied, "flow_denied"),
        "{r:?}"
    );
    for part in [
        "no_exfiltration",
        "private_data (call c1: rag_search)",
        "untrusted_content (call c3: fetch_url)",
    ] {
        assert!(
            r.error_message.contains(part),
            "{part}: {}",
            r.error_message
        );
    }
    assert!(!r.error_message.contains("bad"), "{}", r.error_message);
    // Another run of the same caller has seen nothing.
    let r = run_call(&server, "r2", "c5", "send_email").await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    // Audited: the labels each call added.
    let events = server.audit_events_of("tool_call").await;
    let labels = |id: &str| -> Value {
        events
            .iter()
            .find(|e| e["call_id"] == id)
            .map(|e| e.get("flow_labels").cloned().unwrap_or(Value::Null))
            .unwrap()
    };
    assert_eq!(labels("c1"), serde_json::json!(["private_data"]));
    assert_eq!(labels("c3"), serde_json::json!(["untrusted_content"]));
    assert_eq!(labels("bad"), Value::Null);
    assert_eq!(labels("c4"), Value::Null, "refused: it did not run");
    server.stop().await;
}

on_both_backends!(send_after_both_reads_is_refused_only_in_that_run);

#[tokio::test]
async fn a_require_approval_rule_sends_the_call_through_the_approval_and_a_caller_scope_spans_runs()
{
    let yaml = CATALOG
        .replace("  rules:\n", "  scope: caller\n  rules:\n")
        .replace(
            "    - { name: no_exfiltration, after: [private_data, untrusted_content], deny: [external_send] }",
            "    - { name: review_sends, after: [untrusted_content], require_approval: [external_send] }",
        );
    let server = TestServer::start(&yaml).await;
    assert_eq!(
        run_call(&server, "r1", "c1", "fetch_url").await.status(),
        ToolStatus::Ok
    );
    // Another run id: the caller scope still holds.
    let r = run_call(&server, "r2", "c2", "send_email").await;
    assert_eq!(r.status(), ToolStatus::ApprovalRequired, "{r:?}");
    assert!(
        r.error_message.contains("review_sends"),
        "{}",
        r.error_message
    );
    // The approver reads why: the rule and the call that brought its label.
    let mut approvals = server.approvals().await;
    let pending = approvals
        .get_approval(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::GetApprovalRequest {
                    approval_id: r.approval_id.clone(),
                }),
        )
        .await
        .expect("get approval")
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(
        pending.needed_because,
        "flow rule review_sends: this caller has seen untrusted_content (call c1: fetch_url)"
    );
    // Approved by another identity, the same call runs.
    approvals
        .decide_approval(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::DecideApprovalRequest {
                    approval_id: r.approval_id.clone(),
                    decision: proto::ApprovalDecision::Approve.into(),
                    reason: "checked".into(),
                }),
        )
        .await
        .expect("approve");
    let mut again = call("send_email", "{}");
    again.call_id = "c3".into();
    again.approval_id = r.approval_id.clone();
    // An approval is bound to the run that asked.
    let r = in_run(&server, "r2", again).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    // Another caller is not in this scope.
    let mut client = server.client().await;
    let r = exec(
        &mut client,
        &who("acme").subject("carol"),
        call("send_email", "{}"),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_reads_on_one_sidecar_cannot_send_from_another() {
    let redis = crate::redis_server::RedisServer::start();
    let yaml = CATALOG.replacen(
        "version: 1\n",
        &format!("version: 1\n{}", crate::support::redis_state(&redis.url())),
        1,
    );
    let (a, b) = (
        TestServer::start(&yaml).await,
        TestServer::start(&yaml).await,
    );
    assert_eq!(
        run_call(&a, "r1", "c1", "rag_search").await.status(),
        ToolStatus::Ok
    );
    assert_eq!(
        run_call(&b, "r1", "c2", "fetch_url").await.status(),
        ToolStatus::Ok
    );
    for (sidecar, id) in [(&a, "c3"), (&b, "c4")] {
        let r = run_call(sidecar, "r1", id, "send_email").await;
        assert_eq!(r.error_type, "flow_denied", "{r:?}");
        assert!(
            r.error_message.contains("call c1: rag_search")
                && r.error_message.contains("call c2: fetch_url"),
            "{}",
            r.error_message
        );
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_the_tools_a_rule_governs_fail_closed_and_the_others_run() {
    let mut server = TestServer::start_on(Backend::Redis, CATALOG).await;
    assert_eq!(
        run_call(&server, "r1", "c1", "rag_search").await.status(),
        ToolStatus::Ok
    );
    server.redis.as_mut().expect("its redis").kill();
    // send_email is governed: its scope cannot be read, so it does not run.
    let r = run_call(&server, "r1", "c2", "send_email").await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Unavailable, "state_unavailable"),
        "{r:?}"
    );
    assert!(r.retryable, "{r:?}");
    assert!(
        r.error_message.contains("flow rules"),
        "{}",
        r.error_message
    );
    // Explain says the same, and that the scope cannot be read.
    let explained = explain_in_run(&server, "r1", "send_email").await;
    assert_eq!(explained.decision.unwrap().error_type, "state_unavailable");
    assert!(!explained.flow.unwrap().readable);
    // rag_search is governed by no rule, but carries a label that cannot be recorded: it does
    // not run either. send_email, which carries a label too, was refused before that.
    let r = run_call(&server, "r1", "c3", "rag_search").await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.retryable),
        (ToolStatus::Unavailable, "state_unavailable", true),
        "{r:?}"
    );
    server.stop().await;
}

/// A call whose flow labels cannot be recorded — its scope's store stalled — does not run, so a
/// rule can never let through what a run has seen: the read is refused (retryable, nothing
/// ran), and once the store answers the read runs, is recorded, and the send the rule governs
/// is refused. (Issue 52, item 4: the read ran during the stall, its labels were dropped with a
/// log line, and the send then ran as if the run had seen nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_labels_cannot_be_recorded_does_not_run() {
    let redis = crate::redis_server::RedisServer::start();
    let state = format!(
        "state:\n  backend: redis\n  redis: {{ url: \"{}\", timeout: 300ms }}\n",
        redis.url()
    );
    let server =
        TestServer::start(&CATALOG.replacen("version: 1\n", &format!("version: 1\n{state}"), 1))
            .await;
    let r = run_call(&server, "r1", "c0", "fetch_url").await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    // Every client of Redis waits, the sidecar's too: longer than its timeout.
    let paused = redis.command(&["CLIENT", "PAUSE", "1500", "ALL"]).await;
    assert_eq!(paused, redis::Value::Okay);
    let read = run_call(&server, "r1", "c1", "rag_search").await;
    assert_eq!(
        (read.status(), read.error_type.as_str(), read.retryable),
        (ToolStatus::Unavailable, "state_unavailable", true),
        "{read:?}"
    );
    assert!(read.error_message.contains("was not run"), "{read:?}");
    assert!(
        read.model_text.starts_with("TOOL_ERROR"),
        "no output: {read:?}"
    );
    // Redis answers again (our PING is answered once the pause is over).
    let pong = redis
        .command_within(&["PING"], std::time::Duration::from_secs(15))
        .await;
    assert_eq!(pong, redis::Value::SimpleString("PONG".into()));
    let read = run_call(&server, "r1", "c2", "rag_search").await;
    assert_eq!(read.status(), ToolStatus::Ok, "{read:?}");
    let send = run_call(&server, "r1", "c3", "send_email").await;
    assert_eq!(send.error_type, "flow_denied", "{send:?}");
    assert!(
        send.error_message.contains("call c2: rag_search"),
        "{send:?}"
    );
    // The refused read is audited as refused, without labels.
    let events = server.audit_events().await;
    let c1 = events
        .iter()
        .find(|e| e["call_id"] == "c1")
        .expect("c1 audited");
    assert_eq!(c1["status"], "UNAVAILABLE", "{c1}");
    assert!(c1.get("flow_labels").is_none(), "{c1}");
    server.stop().await;
}

fn seen(explained: &proto::ExplainToolResponse) -> Vec<(String, Vec<String>)> {
    let flow = explained.flow.as_ref().expect("a flow trail");
    flow.seen
        .iter()
        .map(|l| {
            let calls = l
                .calls
                .iter()
                .map(|c| format!("{}: {}", c.call_id, c.tool))
                .collect();
            (l.label.clone(), calls)
        })
        .collect()
}

async fn explain_shows_the_scope_and_the_rule_that_would_fire(backend: Backend) {
    let server = TestServer::start_on(backend, CATALOG).await;
    assert_eq!(
        run_call(&server, "r1", "c1", "rag_search").await.status(),
        ToolStatus::Ok
    );
    let explained = explain_in_run(&server, "r1", "send_email").await;
    assert!(explained.would_execute, "{explained:?}");
    assert_eq!(
        seen(&explained),
        [("private_data".to_owned(), vec!["c1: rag_search".to_owned()])]
    );
    let flow = explained.flow.as_ref().unwrap();
    assert_eq!(
        (
            flow.scope.as_str(),
            flow.readable,
            &flow.adds[..],
            flow.rule.as_str()
        ),
        ("run", true, &["external_send".to_owned()][..], "")
    );
    // Explaining records nothing: a read explained in r1 adds no label.
    let explained = explain_in_run(&server, "r1", "fetch_url").await;
    assert_eq!(explained.flow.as_ref().unwrap().adds, ["untrusted_content"]);
    assert_eq!(
        explain_in_run(&server, "r1", "send_email")
            .await
            .flow
            .unwrap()
            .rule,
        ""
    );
    assert_eq!(
        run_call(&server, "r1", "c2", "fetch_url").await.status(),
        ToolStatus::Ok
    );
    let explained = explain_in_run(&server, "r1", "send_email").await;
    let decision = explained.decision.as_ref().unwrap();
    assert_eq!(
        (decision.error_type.as_str(), decision.refused_by.as_str()),
        ("flow_denied", "access"),
        "{explained:?}"
    );
    let flow = explained.flow.as_ref().unwrap();
    assert_eq!(
        (
            flow.rule.as_str(),
            flow.rule_location.as_str(),
            flow.rule_action.as_str()
        ),
        ("no_exfiltration", "flow.rules[0]", "deny")
    );
    assert_eq!(seen(&explained).len(), 2, "{explained:?}");
    let access = explained
        .stages
        .iter()
        .find(|s| s.stage == "access")
        .unwrap();
    assert_eq!(access.result(), proto::StageResult::Refused);
    assert_eq!(access.rules[0].location, "flow.rules[0]");
    assert!(
        access.detail.contains("call c2: fetch_url"),
        "{}",
        access.detail
    );
    // The stages after access are not reached; execute would refuse the same.
    let quota = explained
        .stages
        .iter()
        .find(|s| s.stage == "rate_limit")
        .unwrap();
    assert_eq!(quota.result(), proto::StageResult::NotReached);
    let r = run_call(&server, "r1", "c3", "send_email").await;
    assert_eq!(r.error_message, decision.error_message);
    // Another run has seen nothing.
    let explained = explain_in_run(&server, "r2", "send_email").await;
    assert!(explained.would_execute && seen(&explained).is_empty());
    server.stop().await;
}

on_both_backends!(explain_shows_the_scope_and_the_rule_that_would_fire);

/// A tenant keeps at most `max_scopes_per_tenant` scopes; past it the least recently labelled
/// goes, taking its labels with it: the documented price of bounded state.
async fn a_tenant_keeps_a_bounded_number_of_scopes(backend: Backend) {
    let yaml = CATALOG.replace("  rules:\n", "  max_scopes_per_tenant: 2\n  rules:\n");
    let server = TestServer::start_on(backend, &yaml).await;
    for run in ["r1", "r2", "r3"] {
        for tool in ["rag_search", "fetch_url"] {
            let r = run_call(&server, run, &format!("{run}-{tool}"), tool).await;
            assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
        }
        // Which run was labelled last is told by the (test server's manual) clock.
        server.clock.advance(std::time::Duration::from_millis(1));
    }
    for run in ["r2", "r3"] {
        let r = run_call(&server, run, "send", "send_email").await;
        assert_eq!(r.error_type, "flow_denied", "{run}: {r:?}");
    }
    let r = run_call(&server, "r1", "send", "send_email").await;
    assert_eq!(r.status(), ToolStatus::Ok, "r1 was evicted: {r:?}");
    server.stop().await;
}

on_both_backends!(a_tenant_keeps_a_bounded_number_of_scopes);
