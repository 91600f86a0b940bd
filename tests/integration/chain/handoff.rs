//! Handoff and delegation (issue 57), through real parts: two sidecars on one throwaway Redis
//! (the parent agent's and the sub-agent's), the same catalog; the parent agent is this test's
//! gRPC client (acme's alice, agent support-bot); the sub-agent is a real A2A agent built with
//! `a2a-sdk` (tests/fixtures/a2a/agent.py) running a scripted model that calls its own sidecar
//! through toolgate's Python client with the delegation its message carried.

use serde_json::{Value, json};
use toolgate::proto::{self, ToolStatus};

use crate::{
    executors::a2a::Agent,
    redis_server::RedisServer,
    support::{TestServer, call, execute_request, redis_state, who},
};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn catalog(agent: &Agent, redis: &RedisServer, handoff_budget: u64) -> String {
    format!(
        r#"version: 1
identity:
  dev_identity: true
  delegation: {{ signing_key_file: "{private}", verify_key_files: ["{public}"] }}
{state}tenants: {{ acme: {{}}, globex: {{}} }}
agents:
  support-bot: {{ allow: [research, rag_search, deeper] }}
  "*": {{ allow: ["*"] }}
budgets:
  run: {{ max_calls: 6 }}
upstreams:
  agents: {{ url: "{url}", allow_schemes: [http], allow_private_addresses: true }}
tools:
  - name: rag_search
    description: Searches the caller's company knowledge base.
    risk_level: read_only
    executor: {{ builtin: echo_arguments }}
    input_schema: {{ type: object, properties: {{ query: {{ type: string }}, filter: {{ type: object, properties: {{ tenant: {{ type: string }} }} }} }}, required: [query] }}
    bind: {{ filter.tenant: "${{caller.tenant}}" }}
  - name: refund_order
    description: Refunds an order.
    risk_level: read_only
    executor: {{ builtin: echo_arguments }}
    input_schema: {{ type: object }}
  - name: research
    description: Hands a research question to the research agent.
    risk_level: read_only
    timeout: 30s
    executor: {{ a2a: {{ upstream: agents, message_argument: question }} }}
    input_schema: {{ type: object, properties: {{ question: {{ type: string }} }}, required: [question] }}
    handoff: {{ agent: research, allow: [rag_search, deeper, refund_order], max_depth: 2, budget: {{ max_calls: {handoff_budget} }} }}
  - name: deeper
    description: Hands a question on to another agent.
    risk_level: read_only
    timeout: 20s
    executor: {{ a2a: {{ upstream: agents, message_argument: question }} }}
    input_schema: {{ type: object, properties: {{ question: {{ type: string }} }}, required: [question] }}
    handoff: {{ agent: deeper, allow: ["*"] }}
"#,
        private = fixture("ec_private.pem"),
        public = fixture("ec_public.pem"),
        state = redis_state(&redis.url()),
        url = agent.url,
    )
}

/// What the scripted sub-agent does: its sidecar, its own identity's tenant, its calls.
fn script(sidecar: &TestServer, tenant: &str, calls: Value, list: bool) -> String {
    format!(
        "subagent {}",
        json!({"sidecar": sidecar.addr.to_string(), "tenant": tenant, "calls": calls, "list": list})
    )
}

/// alice (agent support-bot) calls `tool` on `sidecar` in `run`.
async fn alice_calls(
    sidecar: &TestServer,
    run: &str,
    tool: &str,
    args: Value,
) -> proto::ToolResult {
    let mut request = execute_request(call(tool, &args.to_string()));
    request.run_id = run.into();
    sidecar
        .client()
        .await
        .execute_tool(
            who("acme")
                .subject("alice")
                .agent("support-bot")
                .scopes("toolgate:explain toolgate:approve toolgate:admin")
                .request(request),
        )
        .await
        .expect("ExecuteTool answers")
        .into_inner()
        .result
        .expect("a result")
}

/// The sub-agent's report: what it was shown and what each of its calls got.
fn report(result: &proto::ToolResult) -> Value {
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    serde_json::from_str(&result.model_text).expect("the sub-agent's JSON report")
}

fn outcome(report: &Value, i: usize) -> (String, String) {
    let result = &report["results"][i];
    (
        result["status"].as_str().unwrap_or("").to_owned(),
        result["error_type"].as_str().unwrap_or("").to_owned(),
    )
}

struct Fleet {
    agent: Agent,
    parent: TestServer,
    child: TestServer,
    _redis: RedisServer,
}

async fn fleet(handoff_budget: u64) -> Fleet {
    let redis = RedisServer::start();
    let agent = Agent::start(&[]).await;
    let yaml = catalog(&agent, &redis, handoff_budget);
    let (parent, child) = (
        TestServer::start(&yaml).await,
        TestServer::start(&yaml).await,
    );
    Fleet {
        agent,
        parent,
        child,
        _redis: redis,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_works_for_the_person_only_with_the_tools_its_handoff_allows() {
    let f = fleet(5).await;
    let question = script(
        &f.child,
        "acme",
        json!([
            ["rag_search", {"query": "refund policy"}],
            ["refund_order", {"order": "o-1"}],
            ["research", {"question": "echo again"}]
        ]),
        true,
    );
    let r = alice_calls(&f.parent, "r1", "research", json!({ "question": question })).await;
    let report = report(&r);
    assert_eq!(report["delegated"], true, "{report}");
    // ListTools: only what the handoff allows (and the person may use).
    assert_eq!(report["tools"], json!(["deeper", "rag_search"]), "{report}");
    // The search is bound to the person's tenant, not the sub-agent's.
    assert_eq!(
        outcome(&report, 0),
        ("OK".into(), String::new()),
        "{report}"
    );
    let searched: Value =
        serde_json::from_str(report["results"][0]["model_text"].as_str().unwrap()).unwrap();
    assert_eq!(searched["filter"]["tenant"], "acme", "{searched}");
    // refund_order: the handoff lists it, but support-bot itself may not use it, so neither
    // may the agent it handed off to.
    assert_eq!(
        outcome(&report, 1),
        ("DENIED".into(), "handoff_not_allowed".into()),
        "{report}"
    );
    assert!(
        report["results"][1]["model_text"]
            .as_str()
            .unwrap()
            .contains("not a tool agent support-bot of this chain may use"),
        "{report}"
    );
    // research: support-bot may use it, the handoff does not list it.
    assert_eq!(
        outcome(&report, 2),
        ("DENIED".into(), "handoff_not_allowed".into()),
        "{report}"
    );
    assert!(
        report["results"][2]["model_text"]
            .as_str()
            .unwrap()
            .contains("not among the tools the handoff by support-bot allows"),
        "{report}"
    );
    // The child's audit events carry the chain: the person, the agents, the parent call.
    let event = f
        .child
        .wait_for_audit(|e| e["tool"] == "rag_search" && e["kind"] == "tool_call")
        .await;
    assert_eq!(
        (event["subject"].as_str(), event["agent"].as_str()),
        (Some("alice"), Some("research")),
        "{event}"
    );
    let delegation = &event["delegation"];
    assert_eq!(delegation["agents"], json!(["support-bot"]), "{event}");
    assert_eq!(
        (delegation["depth"].as_u64(), delegation["run_id"].as_str()),
        (Some(1), Some("r1"))
    );
    assert_eq!(
        delegation["parent_call_id"].as_str(),
        Some(r.call_id.as_str())
    );
    // The token went in the message's metadata, never in its text.
    let sent = f
        .agent
        .seen()
        .await
        .into_iter()
        .find(|s| s["body"]["method"] == "SendMessage")
        .expect("the handoff's message");
    let message = &sent["body"]["params"]["message"];
    assert!(
        message["metadata"]["x-toolgate-delegation"].is_string(),
        "{message}"
    );
    assert!(
        !message["parts"][0]["text"]
            .as_str()
            .unwrap()
            .contains("eyJ")
    );
    f.parent.stop().await;
    f.child.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_at_depth_two_runs_and_one_at_depth_three_is_refused() {
    let f = fleet(5).await;
    // The research agent (depth 1) hands on to `deeper` (depth 2), whose agent tries once more
    // (depth 3).
    let innermost = script(
        &f.child,
        "acme",
        json!([["deeper", {"question": "echo too deep"}]]),
        false,
    );
    let middle = script(
        &f.child,
        "acme",
        json!([["deeper", {"question": innermost}]]),
        false,
    );
    let r = alice_calls(
        &f.parent,
        "r-deep",
        "research",
        json!({ "question": middle }),
    )
    .await;
    let depth_one = report(&r);
    assert_eq!(
        outcome(&depth_one, 0),
        ("OK".into(), String::new()),
        "{depth_one}"
    );
    let depth_two: Value =
        serde_json::from_str(depth_one["results"][0]["model_text"].as_str().unwrap()).unwrap();
    assert_eq!(
        outcome(&depth_two, 0),
        ("DENIED".into(), "handoff_too_deep".into()),
        "{depth_two}"
    );
    assert!(
        depth_two["results"][0]["model_text"]
            .as_str()
            .unwrap()
            .contains("depth 3; the chain allows 2"),
        "{depth_two}"
    );
    f.parent.stop().await;
    f.child.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_budget_is_spent_across_both_sidecars_and_the_handoffs_own_budget_holds() {
    let f = fleet(2).await;
    // The handoff gives two calls: the third is refused by its budget.
    let question = script(
        &f.child,
        "acme",
        json!([["rag_search", {"query": "a"}], ["rag_search", {"query": "b"}], ["rag_search", {"query": "c"}]]),
        false,
    );
    let r = alice_calls(
        &f.parent,
        "r-budget",
        "research",
        json!({ "question": question }),
    )
    .await;
    let report = report(&r);
    assert_eq!(
        outcome(&report, 1),
        ("OK".into(), String::new()),
        "{report}"
    );
    assert_eq!(
        outcome(&report, 2),
        ("DENIED".into(), "run_budget_exhausted".into()),
        "{report}"
    );
    assert!(
        report["results"][2]["model_text"]
            .as_str()
            .unwrap()
            .contains("handoff's budget"),
        "{report}"
    );
    // The run has spent 3 of its 6 (the handoff and two searches, on two sidecars): alice gets
    // three more calls in it, on either sidecar, and then none.
    for sidecar in [&f.child, &f.parent, &f.child] {
        let r = alice_calls(sidecar, "r-budget", "rag_search", json!({"query": "x"})).await;
        assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    }
    let r = alice_calls(&f.parent, "r-budget", "rag_search", json!({"query": "x"})).await;
    assert_eq!(r.error_type, "run_budget_exhausted", "{r:?}");
    assert!(
        r.error_message.contains("6 of its 6 calls used"),
        "{}",
        r.error_message
    );
    f.parent.stop().await;
    f.child.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_copied_into_another_tenants_call_forged_or_tampered_is_unauthenticated() {
    let f = fleet(5).await;
    // The sub-agent's own identity is another tenant's: its calls are refused.
    let question = script(
        &f.child,
        "globex",
        json!([["rag_search", {"query": "x"}]]),
        false,
    );
    let r = alice_calls(
        &f.parent,
        "r-x",
        "research",
        json!({ "question": question }),
    )
    .await;
    let report = report(&r);
    assert_eq!(
        report["transport_error"]["code"], "UNAUTHENTICATED",
        "{report}"
    );
    assert!(
        report["transport_error"]["message"]
            .as_str()
            .unwrap()
            .contains("the delegation is for tenant \"acme\""),
        "{report}"
    );
    // The token itself, as the agent received it.
    let token = f
        .agent
        .seen()
        .await
        .iter()
        .find_map(|s| {
            s["body"]["params"]["message"]["metadata"]["x-toolgate-delegation"]
                .as_str()
                .map(str::to_owned)
        })
        .expect("a delegation was sent");
    let with = |token: &str, tenant: Option<&str>| {
        let mut request =
            tonic::Request::new(execute_request(call("rag_search", r#"{"query":"x"}"#)));
        request
            .metadata_mut()
            .insert("x-toolgate-delegation", token.parse().unwrap());
        if let Some(tenant) = tenant {
            request
                .metadata_mut()
                .insert("x-toolgate-tenant", tenant.parse().unwrap());
        }
        request
    };
    let mut client = f.child.client().await;
    // Alone, the token is the person's: the call runs as alice in acme.
    let r = client
        .execute_tool(with(&token, None))
        .await
        .expect("delegated call");
    assert_eq!(r.into_inner().result.unwrap().status(), ToolStatus::Ok);
    // Explain shows the chain and its limits, and what the handoff's budget leaves.
    let mut explain = tonic::Request::new(proto::ExplainToolRequest {
        call: Some(call("rag_search", r#"{"query":"x"}"#)),
        run_id: String::new(),
        step: 0,
        catalog_revision: String::new(),
    });
    explain
        .metadata_mut()
        .insert("x-toolgate-delegation", token.parse().unwrap());
    let explained = client
        .explain_tool(explain)
        .await
        .expect("explained")
        .into_inner();
    let detail = |stage: &str| {
        explained
            .stages
            .iter()
            .find(|s| s.stage == stage)
            .map(|s| s.detail.clone())
            .unwrap_or_default()
    };
    assert!(
        detail("access")
            .contains("delegated: acting for alice through support-bot -> research (depth 1 of 2)"),
        "{explained:?}"
    );
    assert!(
        detail("rate_limit").contains("run \"r-x\": 4 of 6 calls left")
            && detail("rate_limit").contains("the handoff of call"),
        "{explained:?}"
    );
    // The person's approve and admin scopes do not travel: a sub-agent acts only through tool
    // calls.
    let mut list = tonic::Request::new(proto::ListApprovalsRequest::default());
    list.metadata_mut()
        .insert("x-toolgate-delegation", token.parse().unwrap());
    let err = f
        .child
        .approvals()
        .await
        .list_approvals(list)
        .await
        .expect_err("a delegation cannot list approvals");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    // The token is a credential: no audit event of either sidecar carries it; the child's
    // record the chain instead.
    for sidecar in [&f.parent, &f.child] {
        let events = serde_json::to_string(&sidecar.audit_events().await).unwrap();
        assert!(
            !events.contains(&token),
            "the delegation token in the audit log"
        );
    }
    let child = serde_json::to_string(&f.child.audit_events().await).unwrap();
    assert!(child.contains("\"delegation\""), "the chain is recorded");
    // Tampered: one character of its claims changed.
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let flipped = if parts[1].ends_with('A') { 'B' } else { 'A' };
    parts[1].pop();
    parts[1].push(flipped);
    for (forged, why) in [
        (parts.join("."), "signature"),
        (format!("{}.{}.", parts[0], parts[1]), "signature"),
        ("not-a-token".to_owned(), "not a JWT"),
    ] {
        let err = client
            .execute_tool(with(&forged, None))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
        assert!(
            err.message().contains(why) || err.message().contains("delegation"),
            "{err:?}"
        );
    }
    let err = client
        .execute_tool(with(&token, Some("globex")))
        .await
        .expect_err("another tenant's call");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    f.parent.stop().await;
    f.child.stop().await;
}
