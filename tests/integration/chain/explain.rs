//! ExplainTool and ExplainListTools through the real server: explain agrees with execute over
//! generated callers and calls against the demo (a property test whose state — quotas,
//! idempotency keys — evolves as the calls run), explaining changes nothing (quota, approvals,
//! idempotency keys, backends, audit, metrics), the trail names what decided, visibility is
//! ListTools', and who may ask.

use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::{
    prelude::*,
    test_runner::{RngAlgorithm, TestRng, TestRunner},
};
use serde_json::{Value, json};
use tonic::{Code, transport::Channel};
use toolgate::proto::{
    self, StageResult, ToolStatus, approvals_client::ApprovalsClient,
    tool_gate_client::ToolGateClient,
};

use crate::support::{
    START_UNIX_MS, TestServer, Who, call, exec, execute_request, http_get, metric, visible, who,
};

fn explain_request(call: proto::ToolCall) -> proto::ExplainToolRequest {
    let request = execute_request(call);
    proto::ExplainToolRequest {
        call: request.call,
        run_id: request.run_id,
        step: request.step,
        catalog_revision: request.catalog_revision,
    }
}

async fn explain(
    client: &mut ToolGateClient<Channel>,
    who: &Who,
    call: proto::ToolCall,
) -> proto::ExplainToolResponse {
    client
        .explain_tool(who.request(explain_request(call)))
        .await
        .expect("ExplainTool answers")
        .into_inner()
}

fn decision(explained: &proto::ExplainToolResponse) -> &proto::ToolResult {
    explained.decision.as_ref().expect("a decision")
}

fn stage<'a>(explained: &'a proto::ExplainToolResponse, name: &str) -> &'a proto::StageExplanation {
    explained
        .stages
        .iter()
        .find(|s| s.stage == name)
        .unwrap_or_else(|| panic!("no stage {name} in {explained:?}"))
}

// --- explain agrees with execute -----------------------------------------------------------------

/// A generated call of the demo catalog.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) tenant: &'static str,
    pub(crate) subject: &'static str,
    pub(crate) agent: &'static str,
    pub(crate) scopes: Vec<&'static str>,
    pub(crate) tool: &'static str,
    /// 0 valid, 1 valid with a bound key set by the model, 2 an unknown property, 3 `{}`,
    /// 4 not JSON, 5 an array.
    pub(crate) shape: u8,
    /// Picks one of two valid argument sets (so reused idempotency keys can conflict).
    pub(crate) variant: bool,
    pub(crate) version: Option<&'static str>,
    pub(crate) idempotency_key: Option<&'static str>,
    pub(crate) approval_id: Option<&'static str>,
}

const TOOLS: [&str; 8] = [
    "echo",
    "rag_search",
    "query_ticket",
    "create_ticket",
    "refund_order",
    "delete_ticket",
    "slow_task",
    "made_up",
];

fn valid_arguments(tool: &str, variant: bool) -> Value {
    let v = if variant { "b" } else { "a" };
    match tool {
        "echo" => json!({"text": v}),
        "rag_search" => json!({"query": format!("refund {v}")}),
        "query_ticket" | "delete_ticket" => {
            json!({"ticket_id": if variant { "T-2" } else { "T-1" }})
        }
        "create_ticket" => json!({"title": v}),
        "refund_order" => {
            json!({"order_id": "A-1", "amount_cents": if variant { 200 } else { 2500 }})
        }
        "slow_task" => json!({"ms": 0}),
        _ => json!({}),
    }
}

pub(crate) fn arguments_json(case: &Case) -> String {
    let mut arguments = valid_arguments(case.tool, case.variant);
    match case.shape {
        0 => {}
        1 => {
            arguments["tenant"] = json!("globex");
            arguments["filter"] = json!({"tenant": "globex"});
        }
        2 => arguments["unexpected"] = json!(1),
        3 => arguments = json!({}),
        4 => return "{not json".to_owned(),
        _ => return "[1]".to_owned(),
    }
    arguments.to_string()
}

pub(crate) fn cases() -> impl Strategy<Value = Case> {
    (
        (
            prop::sample::select(vec!["acme", "globex", "initech"]),
            prop::sample::select(vec!["", "alice", "bob"]),
            prop::sample::select(vec!["", "support-bot", "Support-Bot", "other-bot"]),
            any::<(bool, bool)>(),
        ),
        (
            // refund_order (5/min) often, so its quota runs out within the run.
            prop_oneof![
                2 => Just(TOOLS[0]), 1 => Just(TOOLS[1]), 1 => Just(TOOLS[2]), 1 => Just(TOOLS[3]),
                3 => Just(TOOLS[4]), 1 => Just(TOOLS[5]), 1 => Just(TOOLS[6]), 1 => Just(TOOLS[7]),
            ],
            prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8), 1 => Just(4u8), 1 => Just(5u8)],
            any::<bool>(),
            prop_oneof![8 => Just(None), 1 => Just(Some("1")), 1 => Just(Some("2"))],
            prop_oneof![2 => Just(None), 1 => Just(Some("k1")), 1 => Just(Some("k2"))],
            prop_oneof![9 => Just(None), 1 => Just(Some("apr_0000"))],
        ),
    )
        .prop_map(
            |((tenant, subject, agent, (read, write)), (tool, shape, variant, version, idempotency_key, approval_id))| {
                let mut scopes = Vec::new();
                if read {
                    scopes.push("tickets:read");
                }
                if write {
                    scopes.push("tickets:write");
                }
                Case {
                    tenant,
                    subject,
                    agent,
                    scopes,
                    tool,
                    shape,
                    variant,
                    version,
                    idempotency_key,
                    approval_id,
                }
            },
        )
}

/// Explains a call, then executes it: the decision must be the one execution makes. The state
/// the stateful stages read (quotas, idempotency keys) carries over from case to case, so replays,
/// conflicts and used-up quotas are explained too. The arguments' SHA-256 explain reports is
/// checked against the audit events at the end.
#[test]
fn explain_agrees_with_execute_over_generated_calls() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(TestServer::demo());
    let client = rt.block_on(server.client());
    let next = AtomicUsize::new(0);
    let hashes = std::sync::Mutex::new(Vec::<(String, String)>::new());
    // A fixed seed: the state each case meets depends on the cases before it, so a failure must
    // replay exactly (and the checks below that the run reached the stateful paths are stable).
    let mut runner = TestRunner::new_with_rng(
        ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let result = runner.run(&cases(), |case| {
        let call_id = format!("c{}", next.fetch_add(1, Ordering::Relaxed));
        let who = Who {
            tenant: case.tenant.into(),
            subject: case.subject.into(),
            agent: case.agent.into(),
            scopes: case.scopes.join(","),
            token: None,
        };
        let call = proto::ToolCall {
            call_id: call_id.clone(),
            name: case.tool.into(),
            arguments_json: arguments_json(&case),
            version: case.version.unwrap_or_default().into(),
            idempotency_key: case.idempotency_key.unwrap_or_default().into(),
            approval_id: case.approval_id.unwrap_or_default().into(),
        };
        let mut client = client.clone();
        let (explained, executed) = rt.block_on(async {
            let explained = explain(&mut client, &who, call.clone()).await;
            (explained, exec(&mut client, &who, call).await)
        });
        let said = decision(&explained);
        prop_assert_eq!(&said.call_id, &executed.call_id);
        prop_assert_eq!(
            &said.tool_version,
            &executed.tool_version,
            "{:?}",
            explained
        );
        if explained.would_execute {
            // Everything before the backend passed; what the backend then did is its own.
            prop_assert!(
                matches!(executed.refused_by.as_str(), "" | "execute" | "result"),
                "explain said the backend would run; execution: {:?}",
                executed
            );
            prop_assert!(!executed.idempotent_replay);
        } else {
            prop_assert_eq!(
                said.status(),
                executed.status(),
                "{:?} vs {:?}",
                explained,
                executed
            );
            prop_assert_eq!(&said.error_type, &executed.error_type);
            prop_assert_eq!(&said.refused_by, &executed.refused_by);
            prop_assert_eq!(said.idempotent_replay, executed.idempotent_replay);
        }
        if !explained.arguments_sha256.is_empty() {
            hashes
                .lock()
                .unwrap()
                .push((call_id, explained.arguments_sha256.clone()));
        }
        Ok(())
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    // The arguments explain said the backend would get are the ones execution hashed, approved
    // and recorded.
    let events = rt.block_on(server.audit_events());
    let hashes = hashes.into_inner().unwrap();
    assert!(
        hashes.len() > 30,
        "too few calls passed bind: {}",
        hashes.len()
    );
    for (call_id, sha) in &hashes {
        let event = events
            .iter()
            .find(|e| e["kind"] == "tool_call" && e["call_id"] == call_id.as_str())
            .unwrap_or_else(|| panic!("no audit event for {call_id}"));
        assert_eq!(
            event["arguments_sha256"].as_str(),
            Some(sha.as_str()),
            "{event}"
        );
    }
    // The generated calls reached the stateful stages: quotas ran out, keys replayed.
    let statuses: Vec<&str> = events.iter().filter_map(|e| e["status"].as_str()).collect();
    assert!(statuses.contains(&"RATE_LIMITED"), "{statuses:?}");
    assert!(
        events.iter().any(|e| e["idempotent_replay"] == true),
        "no idempotent replay was generated"
    );
    rt.block_on(server.stop());
}

// --- explaining changes nothing ------------------------------------------------------------------

const STATEFUL: &str = r#"version: 1
identity: { dev_identity: true }
tenants:
  acme: { rate_limit: 100/min }
tools:
  - name: limited
    description: Returns text; two calls a minute per tenant.
    risk_level: read_only
    rate_limit: 2/min
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } }, required: [text] }
  - name: refund
    description: Refunds an order once a second person approves.
    risk_level: write_confirmed
    executor: { builtin: refund_order }
    input_schema:
      type: object
      properties: { order_id: { type: string }, amount_cents: { type: integer } }
      required: [order_id, amount_cents]
  - name: draft
    description: Writes a draft ticket.
    risk_level: write_draft
    executor: { builtin: create_ticket }
    input_schema:
      type: object
      properties: { title: { type: string }, tenant: { type: string } }
      required: [title]
    bind: { tenant: "${caller.tenant}" }
"#;

async fn tool_calls_counted(server: &TestServer) -> f64 {
    let (_, text) = http_get(server.admin_addr(), "/metrics").await;
    metric(&text, "toolgate_tool_calls_total", &[])
}

async fn pending_approvals(approvals: &mut ApprovalsClient<Channel>) -> Vec<proto::Approval> {
    approvals
        .list_approvals(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::ListApprovalsRequest::default()),
        )
        .await
        .unwrap()
        .into_inner()
        .approvals
}

#[tokio::test]
async fn explaining_consumes_no_quota_creates_no_approval_claims_no_key_and_runs_nothing() {
    let server = TestServer::start(STATEFUL).await;
    let mut client = server.client().await;
    let mut approvals = server.approvals().await;
    let alice = who("acme");
    let executions = server.builtins().executions();

    // Explained again and again: the quota stays full, no approval appears, the key stays new.
    for _ in 0..5 {
        let explained = explain(&mut client, &alice, call("limited", r#"{"text":"hi"}"#)).await;
        assert!(explained.would_execute, "{explained:?}");
        let quotas = &stage(&explained, "rate_limit").quotas;
        let left: Vec<(&str, u64)> = quotas
            .iter()
            .map(|q| (q.scope.as_str(), q.remaining))
            .collect();
        assert_eq!(left, [("tool", 2), ("tenant", 100)]);
        let explained = explain(
            &mut client,
            &alice,
            call("refund", r#"{"order_id":"A-1","amount_cents":100}"#),
        )
        .await;
        assert_eq!(decision(&explained).status(), ToolStatus::ApprovalRequired);
        assert_eq!(
            decision(&explained).approval_id,
            "",
            "explain created an approval"
        );
        let mut keyed = call("draft", r#"{"title":"t"}"#);
        keyed.idempotency_key = "k".into();
        let explained = explain(&mut client, &alice, keyed).await;
        assert!(explained.would_execute, "{explained:?}");
        assert_eq!(
            stage(&explained, "idempotency").result(),
            StageResult::Passed
        );
    }
    assert!(pending_approvals(&mut approvals).await.is_empty());
    assert_eq!(
        server.builtins().executions(),
        executions,
        "explain ran a backend"
    );
    assert!(
        server
            .audit_events()
            .await
            .iter()
            .all(|e| e["kind"] != "tool_call"),
        "explain left tool_call audit events"
    );
    assert_eq!(tool_calls_counted(&server).await, 0.0);

    // The quota is whole: both calls run; then explain and execute agree it is used up.
    for _ in 0..2 {
        let result = exec(&mut client, &alice, call("limited", r#"{"text":"hi"}"#)).await;
        assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    }
    let explained = explain(&mut client, &alice, call("limited", r#"{"text":"hi"}"#)).await;
    assert_eq!(decision(&explained).status(), ToolStatus::RateLimited);
    assert_eq!(stage(&explained, "rate_limit").quotas[0].remaining, 0);
    let result = exec(&mut client, &alice, call("limited", r#"{"text":"hi"}"#)).await;
    assert_eq!(result.status(), ToolStatus::RateLimited);

    // The approval the call creates is the only one; explained with it, it would be accepted
    // (and stays usable); executed, it is used; explained again, it is used up.
    let refund = || call("refund", r#"{"order_id":"A-1","amount_cents":100}"#);
    let requested = exec(&mut client, &alice, refund()).await;
    assert_eq!(requested.status(), ToolStatus::ApprovalRequired);
    let id = requested.approval_id.clone();
    assert_eq!(pending_approvals(&mut approvals).await.len(), 1);
    approvals
        .decide_approval(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::DecideApprovalRequest {
                    approval_id: id.clone(),
                    decision: proto::ApprovalDecision::Approve as i32,
                    reason: "ok".into(),
                }),
        )
        .await
        .unwrap();
    let with_id = || proto::ToolCall {
        approval_id: id.clone(),
        ..refund()
    };
    for _ in 0..3 {
        let explained = explain(&mut client, &alice, with_id()).await;
        assert!(explained.would_execute, "{explained:?}");
        assert_eq!(decision(&explained).approval_id, id);
        assert_eq!(stage(&explained, "approval").result(), StageResult::Passed);
    }
    let result = exec(&mut client, &alice, with_id()).await;
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    let explained = explain(&mut client, &alice, with_id()).await;
    assert_eq!(decision(&explained).error_type, "approval_already_used");

    // The key: the first execution runs; explain then says it would replay, or conflict with
    // other arguments; nothing ran for it.
    let keyed = |title: &str| proto::ToolCall {
        idempotency_key: "k".into(),
        ..call("draft", &json!({ "title": title }).to_string())
    };
    let before = server.builtins().executions();
    let result = exec(&mut client, &alice, keyed("t")).await;
    assert_eq!(result.status(), ToolStatus::Ok);
    assert_eq!(server.builtins().executions(), before + 1);
    let explained = explain(&mut client, &alice, keyed("t")).await;
    assert!(!explained.would_execute);
    assert!(decision(&explained).idempotent_replay, "{explained:?}");
    assert_eq!(decision(&explained).status(), ToolStatus::Ok);
    let explained = explain(&mut client, &alice, keyed("other")).await;
    assert_eq!(decision(&explained).error_type, "idempotency_conflict");
    let replay = exec(&mut client, &alice, keyed("t")).await;
    assert!(replay.idempotent_replay);
    assert_eq!(server.builtins().executions(), before + 1);
    server.stop().await;
}

// --- the trail -----------------------------------------------------------------------------------

const TRAIL: &str = r#"version: 1
identity: { dev_identity: true }
policy: { deny: ["internal_*"] }
tenants:
  acme: {}
  globex: { deny: ["wire", "pay_*"] }
agents:
  clerk: { allow: ["lookup", "pay_card"] }
  "*": { allow: ["*"] }
tools:
  - name: lookup
    description: Looks a record up.
    risk_level: read_only
    required_scopes: ["records:read", "records:write"]
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties:
        id: { type: string, pattern: "^R-[0-9]+$" }
        limit: { type: integer, maximum: 10 }
      required: [id]
      additionalProperties: false
  - name: pay_card
    description: Charges a card.
    risk_level: write_draft
    record_arguments: true
    redact: ["/card"]
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties:
        card: { type: string }
        tenant: { type: string }
        by: { type: string }
        channel: { type: string }
      required: [card]
    bind: { tenant: "${caller.tenant}", by: "${caller.subject}", channel: web }
  - name: wire
    description: Wires money.
    risk_level: write_draft
    executor: { builtin: echo_arguments }
    input_schema: { type: object }
  - name: internal_reset
    description: Resets everything.
    risk_level: destructive
    executor: { builtin: echo_arguments }
    input_schema: { type: object }
"#;

#[tokio::test]
async fn the_trail_names_the_rule_the_scope_every_violation_and_the_bound_values() {
    let server = TestServer::start(TRAIL).await;
    let mut client = server.client().await;

    // The deny rule, with where the file defines it: the second pattern of globex's list.
    let explained = explain(
        &mut client,
        &who("globex"),
        call("pay_card", r#"{"card":"4111"}"#),
    )
    .await;
    // The caller would be answered as for an unknown tool; the trail says what refused it.
    assert_eq!(decision(&explained).refused_by, "resolve");
    assert_eq!(decision(&explained).error_type, "tool_not_found");
    let access = stage(&explained, "access");
    assert_eq!(access.result(), StageResult::Refused);
    assert_eq!(
        access
            .rules
            .iter()
            .map(|r| (r.location.as_str(), r.pattern.as_str(), r.effect.as_str()))
            .collect::<Vec<_>>(),
        [("tenants.globex.deny[1]", "pay_*", "deny")]
    );
    // Stages after the refusal are not reached; the backend is never run.
    for later in [
        "scopes",
        "schema",
        "bind",
        "rate_limit",
        "approval",
        "idempotency",
        "execute",
    ] {
        assert_eq!(
            stage(&explained, later).result(),
            StageResult::NotReached,
            "{later}"
        );
    }
    assert_eq!(explained.final_arguments_json, "");
    let explained = explain(&mut client, &who("acme"), call("internal_reset", "{}")).await;
    assert_eq!(
        stage(&explained, "access").rules[0].location,
        "policy.deny[0]"
    );
    // An allow list that does not list the tool is named as such; passing rules are listed.
    let clerk = who("acme").agent("clerk");
    let explained = explain(&mut client, &clerk, call("wire", "{}")).await;
    assert_eq!(
        stage(&explained, "access").rules[0].location,
        "agents.clerk.allow"
    );
    let explained = explain(&mut client, &clerk, call("pay_card", r#"{"card":"4111"}"#)).await;
    assert_eq!(stage(&explained, "access").result(), StageResult::Passed);
    assert_eq!(
        stage(&explained, "access").rules[0].location,
        "agents.clerk.allow[1]"
    );

    // The scope missing; with it, every schema violation at once.
    let reader = who("acme").scopes("records:read");
    let explained = explain(&mut client, &reader, call("lookup", r#"{"id":"R-1"}"#)).await;
    assert_eq!(stage(&explained, "scopes").missing_scope, "records:write");
    // The caller would be told the tool does not exist; the stage names the scope.
    assert_eq!(decision(&explained).error_type, "tool_not_found");
    let both = who("acme").scopes("records:read,records:write");
    let explained = explain(
        &mut client,
        &both,
        call("lookup", r#"{"id":"X","limit":99,"extra":true}"#),
    )
    .await;
    let schema = stage(&explained, "schema");
    assert_eq!(schema.result(), StageResult::Refused);
    assert_eq!(
        schema.schema_violations.len(),
        3,
        "{:?}",
        schema.schema_violations
    );
    for at in ["/id", "/limit", "/:"] {
        assert!(
            schema.schema_violations.iter().any(|v| v.starts_with(at)),
            "no violation at {at}: {:?}",
            schema.schema_violations
        );
    }
    // Values are masked, as in refusals.
    assert!(
        !schema.schema_violations.concat().contains("99"),
        "{:?}",
        schema.schema_violations
    );

    // The bound values and the final arguments, redacted as the audit log records them.
    let explained = explain(
        &mut client,
        &who("acme").subject("ada"),
        call("pay_card", r#"{"card":"4111-1111"}"#),
    )
    .await;
    assert!(explained.would_execute, "{explained:?}");
    let bound: Vec<(&str, &str, &str)> = stage(&explained, "bind")
        .bound_arguments
        .iter()
        .map(|b| (b.path.as_str(), b.value_json.as_str(), b.source.as_str()))
        .collect();
    assert_eq!(
        bound,
        [
            ("by", r#""ada""#, "${caller.subject}"),
            ("channel", r#""web""#, "constant"),
            ("tenant", r#""acme""#, "${caller.tenant}"),
        ]
    );
    assert_eq!(
        explained.final_arguments_json,
        r#"{"by":"ada","card":"[redacted]","channel":"web","tenant":"acme"}"#
    );
    assert_eq!(explained.bound_override_attempts, Vec::<String>::new());
    // A model that sets a bound key is refused by bind, and the attempt is named.
    let explained = explain(
        &mut client,
        &who("acme").subject("ada"),
        call("pay_card", r#"{"card":"4111-1111","channel":"phone"}"#),
    )
    .await;
    assert_eq!(decision(&explained).error_type, "bound_argument_override");
    assert_eq!(explained.bound_override_attempts, ["channel"]);
    // The hash is the one execution records for the same call.
    let mut executed_call = call("pay_card", r#"{"card":"4111-1111"}"#);
    executed_call.call_id = "pay-1".into();
    let executed = exec(
        &mut client,
        &who("acme").subject("ada"),
        executed_call.clone(),
    )
    .await;
    assert_eq!(executed.status(), ToolStatus::Ok);
    let explained = explain(&mut client, &who("acme").subject("ada"), executed_call).await;
    let event = server.wait_for_audit(|e| e["call_id"] == "pay-1").await;
    assert_eq!(
        event["arguments_sha256"].as_str(),
        Some(explained.arguments_sha256.as_str())
    );
    assert_eq!(
        serde_json::to_string(&event["arguments"]).unwrap(),
        explained.final_arguments_json,
        "explain redacts as the audit log does"
    );
    server.stop().await;
}

#[tokio::test]
async fn explain_list_tools_agrees_with_list_tools_and_names_what_hides_each_tool() {
    let server = TestServer::start(TRAIL).await;
    let mut client = server.client().await;
    let callers = [
        who("acme"),
        who("globex"),
        who("initech"),
        who("acme").agent("clerk"),
        who("acme").scopes("records:read,records:write"),
        who("acme")
            .agent("clerk")
            .scopes("records:read,records:write"),
    ];
    for caller in &callers {
        let listed = client
            .explain_list_tools(caller.request(proto::ExplainListToolsRequest {}))
            .await
            .unwrap()
            .into_inner();
        let shown_by_explain: Vec<String> = listed
            .tools
            .iter()
            .filter(|t| t.visible)
            .map(|t| t.name.clone())
            .collect();
        assert_eq!(
            shown_by_explain,
            visible(&mut client, caller).await,
            "{caller:?}"
        );
        let revision = client
            .list_tools(caller.request(proto::ListToolsRequest {}))
            .await
            .unwrap()
            .into_inner()
            .catalog_revision;
        assert_eq!(listed.catalog_revision, revision);
        assert_eq!(listed.tools.len(), 4, "every tool of the catalog is listed");
        for tool in listed.tools.iter().filter(|t| !t.visible) {
            assert!(
                ["resolve", "access", "scopes"].contains(&tool.hidden_by.as_str()),
                "{tool:?}"
            );
        }
    }
    let listed = client
        .explain_list_tools(who("globex").request(proto::ExplainListToolsRequest {}))
        .await
        .unwrap()
        .into_inner();
    let hidden: Vec<(&str, &str, &str)> = listed
        .tools
        .iter()
        .filter(|t| !t.visible)
        .map(|t| {
            let rule = t
                .rule
                .as_ref()
                .map_or(t.missing_scope.as_str(), |r| r.location.as_str());
            (t.name.as_str(), t.hidden_by.as_str(), rule)
        })
        .collect();
    assert_eq!(
        hidden,
        [
            ("internal_reset", "access", "policy.deny[0]"),
            ("lookup", "scopes", "records:read"),
            ("pay_card", "access", "tenants.globex.deny[1]"),
            ("wire", "access", "tenants.globex.deny[0]"),
        ]
    );
    server.stop().await;
}

// --- who may ask ---------------------------------------------------------------------------------

const SECRET: &str = "explain-test-secret-0123456789abcdef";

fn token(scope: &str) -> String {
    let claims = json!({
        "tenant": "acme", "sub": "ops", "scope": scope,
        "iss": "https://issuer.test", "aud": "toolgate", "exp": START_UNIX_MS / 1000 + 600,
    });
    crate::support::hs256_jwt(SECRET, &claims)
}

#[tokio::test]
async fn a_jwt_caller_needs_the_explain_scope() {
    let env = toolgate::settings::Env::default().with("EXPLAIN_TEST_SECRET", SECRET);
    let yaml = r#"version: 1
identity:
  jwt: { hs256_secret_env: EXPLAIN_TEST_SECRET, issuer: ["https://issuer.test"], audience: [toolgate] }
tenants: { acme: {} }
tools:
  - { name: echo, description: Echoes., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object } }
"#;
    let server = TestServer::start_with_env(yaml, &env).await;
    let mut client = server.client().await;
    let without = Who::token(&token("tools:read"));
    let refused = client
        .explain_tool(without.request(explain_request(call("echo", "{}"))))
        .await
        .expect_err("no explain scope");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("toolgate:explain"),
        "{refused:?}"
    );
    let refused = client
        .explain_list_tools(without.request(proto::ExplainListToolsRequest {}))
        .await
        .expect_err("no explain scope");
    assert_eq!(refused.code(), Code::PermissionDenied);
    let with = Who::token(&token("toolgate:explain"));
    let explained = explain(&mut client, &with, call("echo", r#"{"text":"x"}"#)).await;
    assert!(explained.would_execute, "{explained:?}");
    // A request without a call is malformed, as for ExecuteTool.
    let malformed = client
        .explain_tool(with.request(proto::ExplainToolRequest::default()))
        .await
        .expect_err("no call");
    assert_eq!(malformed.code(), Code::InvalidArgument);
    server.stop().await;
}
