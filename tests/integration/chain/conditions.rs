//! Conditions (issue 30): CEL `when:` on allow and deny entries and on a tool's approval,
//! through the real server. A condition on the caller is decided at list time; one on the call
//! (`args`, `now`, `run`) lists the tool and decides the call after bind; one that cannot be
//! evaluated decides closed, naming the rule and the error.

use std::{path::Path, time::Duration};

use toolgate::{
    config::Config,
    proto::{self, ApprovalDecision, ToolStatus},
    settings::Env,
};

use crate::support::{TestServer, call, exec, visible, who};

const CATALOG: &str = r#"version: 1
identity: { dev_identity: true }
policy:
  deny:
    # Errors when `limit` is absent: decided closed, so such calls are denied.
    - { tools: [lookup], when: "args.limit > 5" }
    # The injected clock: no night jobs before 06:00 UTC.
    - { tools: [night_job], when: "now.getHours() < 6" }
tenants:
  acme:
    deny:
      - { tools: [send_email], when: "!args.to.endsWith('@acme.com')" }
  globex:
    allow:
      - lookup
      - { tools: [export], when: "caller.agent == 'finance-bot'" }
      - { tools: [count], when: "args.n + 1 > 2" }
tools:
  - name: send_email
    description: Sends an email.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { to: { type: string }, text: { type: string } }, required: [to] }
  - name: lookup
    description: Looks up.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { limit: { type: integer } } }
  - name: night_job
    description: Runs a job.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object }
  - name: export
    description: Exports.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object }
  - name: count
    description: Counts.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { n: { type: integer } } }
  - name: refund
    description: Refunds.
    risk_level: write_confirmed
    approval: { when: "args.amount_cents > 50000 || args.currency != 'EUR'" }
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties: { amount_cents: { type: integer }, currency: { type: string } }
      required: [amount_cents]
"#;

/// A call with an id of its own, so its audit event can be told apart.
pub(crate) fn call_as(id: &str, name: &str, args: &str) -> proto::ToolCall {
    let mut call = call(name, args);
    call.call_id = id.into();
    call
}

/// The audit event of the call with this id.
pub(crate) async fn audited(server: &TestServer, call_id: &str) -> serde_json::Value {
    let events = server.audit_events().await;
    events
        .into_iter()
        .find(|e| e["call_id"] == call_id)
        .expect("audited")
}

fn refusal(result: &proto::ToolResult) -> (ToolStatus, &str, &str) {
    (
        result.status(),
        result.error_type.as_str(),
        result.error_message.as_str(),
    )
}

#[tokio::test]
async fn a_conditional_deny_applies_only_to_the_calls_it_holds_for() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    // Its condition reads the arguments: listed, and decided per call.
    assert!(
        visible(&mut client, &acme)
            .await
            .contains(&"send_email".to_owned())
    );
    let inside = exec(
        &mut client,
        &acme,
        call("send_email", r#"{"to":"bob@acme.com"}"#),
    )
    .await;
    assert_eq!(inside.status(), ToolStatus::Ok, "{inside:?}");
    let outside = exec(
        &mut client,
        &acme,
        call_as("outside", "send_email", r#"{"to":"eve@evil.example"}"#),
    )
    .await;
    let (status, error_type, message) = refusal(&outside);
    assert_eq!(
        (status, error_type),
        (ToolStatus::Denied, "denied_by_policy")
    );
    assert!(message.contains("tenants.acme.deny[0]"), "{message}");
    assert!(message.contains("endsWith('@acme.com')"), "{message}");
    let denied = audited(&server, &outside.call_id).await;
    assert_eq!(denied["error_type"], "denied_by_policy", "{denied}");
    // Decided on the bound arguments, whose hash the record keeps (as explain reports it).
    let sha = toolgate::canonical::sha256_hex(&serde_json::json!({"to": "eve@evil.example"}));
    assert_eq!(denied["arguments_sha256"], sha.as_str(), "{denied}");
}

#[tokio::test]
async fn a_deny_whose_condition_cannot_be_evaluated_denies() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let small = exec(&mut client, &acme, call("lookup", r#"{"limit":3}"#)).await;
    assert_eq!(small.status(), ToolStatus::Ok, "{small:?}");
    let large = exec(&mut client, &acme, call("lookup", r#"{"limit":10}"#)).await;
    assert_eq!(refusal(&large).1, "denied_by_policy");
    // No `limit`: `args.limit > 5` has no value; the deny rule applies (closed).
    let missing = exec(&mut client, &acme, call_as("missing", "lookup", "{}")).await;
    let (status, error_type, message) = refusal(&missing);
    assert_eq!(
        (status, error_type),
        (ToolStatus::Denied, "condition_error"),
        "{message}"
    );
    assert!(message.contains("policy.deny[0]"), "{message}");
    assert!(message.contains("could not be evaluated"), "{message}");
    assert!(message.contains("limit"), "names the error: {message}");
    let event = audited(&server, &missing.call_id).await;
    assert_eq!(event["error_type"], "condition_error", "{event}");
}

#[tokio::test]
async fn a_condition_on_the_caller_decides_what_is_listed() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let finance = who("globex").agent("finance-bot");
    let support = who("globex").agent("support-bot");
    assert!(
        visible(&mut client, &finance)
            .await
            .contains(&"export".to_owned())
    );
    assert!(
        !visible(&mut client, &support)
            .await
            .contains(&"export".to_owned())
    );
    let allowed = exec(&mut client, &finance, call("export", "{}")).await;
    assert_eq!(allowed.status(), ToolStatus::Ok, "{allowed:?}");
    // Hidden from this caller: refused as a tool that does not exist.
    let hidden = exec(&mut client, &support, call("export", "{}")).await;
    assert_eq!(refusal(&hidden).1, "tool_not_found", "{hidden:?}");
}

#[tokio::test]
async fn an_allow_whose_condition_cannot_be_evaluated_does_not_allow() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let globex = who("globex");
    // It reads the arguments: listed for globex.
    assert!(
        visible(&mut client, &globex)
            .await
            .contains(&"count".to_owned())
    );
    let two = exec(&mut client, &globex, call("count", r#"{"n":2}"#)).await;
    assert_eq!(two.status(), ToolStatus::Ok, "{two:?}");
    // `2.0` is the integer the schema says: the condition reads the canonical arguments, as the
    // hash, the quota cost and the approval do (int + int, not double + int, an error).
    let two = exec(&mut client, &globex, call("count", r#"{"n":2.0}"#)).await;
    assert_eq!(two.status(), ToolStatus::Ok, "{two:?}");
    let one = exec(&mut client, &globex, call("count", r#"{"n":1}"#)).await;
    let (status, error_type, message) = refusal(&one);
    assert_eq!(
        (status, error_type),
        (ToolStatus::Denied, "denied_by_policy")
    );
    assert!(message.contains("allow list"), "{message}");
    let none = exec(&mut client, &globex, call("count", "{}")).await;
    let (status, error_type, message) = refusal(&none);
    assert_eq!(
        (status, error_type),
        (ToolStatus::Denied, "condition_error"),
        "{message}"
    );
    assert!(message.contains("tenants.globex.allow[2]"), "{message}");
}

#[tokio::test]
async fn now_is_the_boundarys_clock() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    // The test clock starts at 08:00 UTC.
    let day = exec(&mut client, &acme, call("night_job", "{}")).await;
    assert_eq!(day.status(), ToolStatus::Ok, "{day:?}");
    server.clock.advance(Duration::from_secs(17 * 3600));
    let night = exec(&mut client, &acme, call("night_job", "{}")).await;
    assert_eq!(refusal(&night).1, "denied_by_policy", "{night:?}");
}

#[tokio::test]
async fn approval_is_needed_only_when_its_condition_holds_or_fails() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let small = exec(
        &mut client,
        &acme,
        call("refund", r#"{"amount_cents":100,"currency":"EUR"}"#),
    )
    .await;
    assert_eq!(small.status(), ToolStatus::Ok, "{small:?}");
    let large = exec(
        &mut client,
        &acme,
        call("refund", r#"{"amount_cents":60000,"currency":"EUR"}"#),
    )
    .await;
    let (status, _, message) = refusal(&large);
    assert_eq!(status, ToolStatus::ApprovalRequired, "{large:?}");
    assert!(message.contains("holds"), "{message}");
    // No currency: `args.currency != 'EUR'` has no value, so the call needs approval (closed).
    let args = r#"{"amount_cents":100}"#;
    let unknown = exec(&mut client, &acme, call("refund", args)).await;
    let (status, _, message) = refusal(&unknown);
    assert_eq!(status, ToolStatus::ApprovalRequired, "{unknown:?}");
    assert!(message.contains("could not be evaluated"), "{message}");
    // Approved by someone else, the same call goes through once.
    let id = unknown.approval_id.clone();
    assert!(!id.is_empty());
    let bob = who("acme").subject("bob").scopes("toolgate:approve");
    server
        .approvals()
        .await
        .decide_approval(bob.request(proto::DecideApprovalRequest {
            approval_id: id.clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: "ok".into(),
        }))
        .await
        .expect("approved");
    let mut retry = call("refund", args);
    retry.approval_id = id;
    let done = exec(&mut client, &acme, retry).await;
    assert_eq!(done.status(), ToolStatus::Ok, "{done:?}");
}

#[tokio::test]
async fn listing_shows_that_a_conditional_approval_may_be_needed() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let tools = client
        .list_tools(who("acme").request(proto::ListToolsRequest {}))
        .await
        .expect("ListTools")
        .into_inner()
        .tools;
    let refund = tools.iter().find(|t| t.name == "refund").expect("listed");
    assert!(refund.requires_approval, "{refund:?}");
}

fn load(yaml: &str) -> Result<Config, toolgate::settings::ConfigError> {
    Config::from_yaml(yaml, "c.yaml", Path::new("."), &Env::default())
}

#[test]
fn a_bad_condition_is_a_load_error_naming_where_and_what() {
    for (from, to, path, words) in [
        (
            "when: \"!args.to.endsWith('@acme.com')\"",
            "when: \"secrets.x == 1\"",
            "tenants.acme.deny[0].when",
            "unknown variable \"secrets\"",
        ),
        (
            "when: \"args.limit > 5\"",
            "when: \"args.limit >\"",
            "policy.deny[0].when",
            "syntax error",
        ),
        (
            "when: \"args.n + 1 > 2\"",
            "when: \"myFunction(args.n)\"",
            "tenants.globex.allow[2].when",
            "function \"myFunction\"",
        ),
        (
            "{ tools: [export], when:",
            "{ tools: [exprot], when:",
            "tenants.globex.allow[1].tools[0]",
            "matches no tool",
        ),
        (
            "{ tools: [export], when: \"caller.agent == 'finance-bot'\" }",
            "{ tools: [export], if: \"caller.agent == 'finance-bot'\" }",
            "tenants.globex.allow[1]",
            "unknown field",
        ),
    ] {
        assert!(CATALOG.contains(from), "{from}");
        let err = load(&CATALOG.replacen(from, to, 1)).expect_err(to);
        assert!(
            err.path.starts_with(path),
            "{to}: {} {}",
            err.path,
            err.message
        );
        assert!(err.message.contains(words), "{to}: {}", err.message);
    }
    load(CATALOG).expect("the catalog loads");
}

#[test]
fn an_approval_condition_on_a_tool_that_never_needs_approval_is_refused() {
    let yaml = CATALOG.replacen("risk_level: write_confirmed", "risk_level: read_only", 1);
    let err = load(&yaml).expect_err("read_only with approval.when");
    assert!(err.path.ends_with("approval.when"), "{}", err.path);
    assert!(
        err.message.contains("never needs approval"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn explain_lists_every_condition_evaluated_with_its_value_or_error() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let explain = |args: &str| proto::ExplainToolRequest {
        call: Some(call("refund", args)),
        run_id: "run-1".into(),
        ..Default::default()
    };
    let explained = |args: &'static str| {
        let request = who("acme").request(explain(args));
        let mut client = client.clone();
        async move {
            client
                .explain_tool(request)
                .await
                .expect("ExplainTool")
                .into_inner()
                .conditions
        }
    };
    let held = explained(r#"{"amount_cents":60000,"currency":"EUR"}"#).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].location, "refund@1.approval.when");
    assert_eq!(
        held[0].expression,
        "args.amount_cents > 50000 || args.currency != 'EUR'"
    );
    assert!(held[0].value && held[0].error.is_empty(), "{held:?}");
    let failed = explained(r#"{"amount_cents":100}"#).await;
    assert!(
        !failed[0].value && failed[0].error.contains("currency"),
        "{failed:?}"
    );
    // A deny entry on the arguments, evaluated after bind and named by its entry.
    let request = who("acme").request(proto::ExplainToolRequest {
        call: Some(call("send_email", r#"{"to":"eve@evil.example"}"#)),
        run_id: "run-1".into(),
        ..Default::default()
    });
    let response = client
        .explain_tool(request)
        .await
        .expect("ExplainTool")
        .into_inner();
    let conditions: Vec<_> = response
        .conditions
        .iter()
        .map(|c| (c.location.as_str(), c.value))
        .collect();
    assert_eq!(conditions, [("tenants.acme.deny[0]", true)], "{response:?}");
    let access = response
        .stages
        .iter()
        .find(|s| s.stage == "access")
        .expect("access");
    assert_eq!(
        access.rules[0].location, "tenants.acme.deny[0]",
        "{access:?}"
    );
    assert!(
        access
            .detail
            .ends_with("(decided after bind, on the bound arguments)"),
        "{access:?}"
    );
    // Scopes, schema and bind ran before it, and the arguments it read are shown.
    let bind = response
        .stages
        .iter()
        .find(|s| s.stage == "bind")
        .expect("bind");
    assert_eq!(bind.result(), proto::StageResult::Passed, "{bind:?}");
    assert_eq!(
        response.final_arguments_json,
        r#"{"to":"eve@evil.example"}"#
    );
}

/// "No recipient twice": a rule quadratic in arguments the caller chooses, on a tool limited to
/// one call a minute.
const QUADRATIC: &str = r#"version: 1
identity: { dev_identity: true }
tenants:
  acme:
    deny:
      - { tools: [send_email], when: "!args.to.all(a, args.to.exists_one(b, b == a))" }
tools:
  - name: send_email
    description: Sends an e-mail to each recipient once.
    risk_level: read_only
    rate_limit: 1/min
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { to: { type: array, items: { type: string } } }, required: [to] }
  - name: echo
    description: Echoes.
    risk_level: read_only
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } } }
"#;

/// `{"to": [n distinct recipients]}`.
fn recipients(n: usize) -> String {
    let to: Vec<String> = (0..n).map(|i| format!("r{i}@example.com")).collect();
    serde_json::json!({ "to": to }).to_string()
}

/// A condition's evaluation has a budget of steps: the quadratic rule on 3,000 recipients
/// stops at it and refuses the call, clearly and not retryably; on a handful it decides as
/// always; and once the tool's quota has no room, a call is refused by the quota before the
/// rule is evaluated at all. (Issue 52, item 2: 15,000 recipients took ~7 s of CPU, and the
/// 1/min tool refused its repeats only after evaluating them.)
#[tokio::test]
async fn a_condition_stops_at_its_budget_and_a_full_quota_refuses_before_it() {
    let server = TestServer::start(QUADRATIC).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let refused = exec(&mut client, &acme, call("send_email", &recipients(3_000))).await;
    assert_eq!(
        (
            refused.status(),
            refused.error_type.as_str(),
            refused.retryable
        ),
        (ToolStatus::Denied, "condition_error", false),
        "{refused:?}"
    );
    assert!(
        refused
            .error_message
            .contains("took more than 1000000 steps"),
        "{}",
        refused.error_message
    );
    // Refused by access, it took nothing of the quota: a small call runs and takes it.
    let sent = exec(&mut client, &acme, call("send_email", &recipients(5))).await;
    assert_eq!(sent.status(), ToolStatus::Ok, "{sent:?}");
    let twice = r#"{"to":["a@example.com","a@example.com"]}"#;
    let repeat = exec(&mut client, &acme, call("send_email", twice)).await;
    assert_eq!(repeat.error_type, "rate_limited", "{repeat:?}");
    // The quota has no room: the large call is refused by it, its rule never evaluated.
    let large = exec(&mut client, &acme, call("send_email", &recipients(3_000))).await;
    assert_eq!(
        (large.error_type.as_str(), large.refused_by.as_str()),
        ("rate_limited", "rate_limit"),
        "{large:?}"
    );
    server.stop().await;
}

/// CPU seconds (user and system) in a `/proc/.../stat` line, and its `comm`.
fn stat_cpu(path: &Path) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let comm = stat.split_once('(')?.1.rsplit_once(')')?.0.to_owned();
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after "(comm) state".
    Some((
        comm,
        fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?,
    ))
}

/// Ticks of CPU of each live thread of `pid`, by thread id.
fn threads_cpu(pid: u32) -> std::collections::BTreeMap<String, (String, u64)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| {
            let task = task.ok()?;
            let cpu = stat_cpu(&task.path().join("stat"))?;
            Some((task.file_name().to_string_lossy().into_owned(), cpu))
        })
        .collect()
}

/// An evaluation that can take long (a comprehension over the call's arguments) never runs
/// on the async workers, where it would stall every other caller: the real binary, given calls
/// whose rule takes most of its budget, spends their CPU on threads of their own
/// (`toolgate-conditions`, gone once each answered), not on the threads that live on — the
/// runtime's workers among them. (Issue 52, item 2: the evaluation ran on the workers, and two
/// such calls made another tenant's `echo` wait 6 s.)
#[tokio::test]
async fn an_evaluation_that_can_take_long_runs_apart_from_the_async_workers() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.yaml");
    std::fs::write(
        &file,
        QUADRATIC.replace("rate_limit: 1/min", "rate_limit: 1000/s"),
    )
    .unwrap();
    let spawned =
        crate::support::binary::spawn_with_env(&["--config", file.to_str().unwrap()], &[]);
    let pid = spawned.child.id();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = toolgate::proto::tool_gate_client::ToolGateClient::new(channel);
    // 250 distinct recipients: ~750,000 steps of the budget's 1,000,000 (12 an inner
    // iteration), each call.
    let args = recipients(250);
    let live_before = threads_cpu(pid);
    let (_, process_before) = stat_cpu(Path::new(&format!("/proc/{pid}/stat"))).unwrap();
    for _ in 0..12 {
        let sent = exec(&mut client, &who("acme"), call("send_email", &args)).await;
        assert_eq!(sent.status(), ToolStatus::Ok, "{sent:?}");
    }
    let (_, process_after) = stat_cpu(Path::new(&format!("/proc/{pid}/stat"))).unwrap();
    let live_after = threads_cpu(pid);
    let spent = process_after - process_before;
    let on_live_threads: u64 = live_after
        .iter()
        .map(|(tid, (_, after))| after - live_before.get(tid).map_or(0, |(_, before)| *before))
        .sum();
    assert!(
        spent >= 20,
        "the calls took {spent} ticks: too little to tell where they ran"
    );
    assert!(
        on_live_threads * 2 < spent,
        "{on_live_threads} of the {spent} ticks the calls took were on threads that live on: {live_after:?}"
    );
    crate::support::binary::stop(spawned).await;
}

/// `toolgate check` warns of a condition whose cost grows worse than linearly in the
/// arguments, naming where it is, and still passes the catalog; a linear one draws nothing.
#[test]
fn check_warns_of_a_condition_that_grows_with_the_product_of_the_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let check = |yaml: &str| {
        let file = dir.path().join("catalog.yaml");
        std::fs::write(&file, yaml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["check", "--config", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    let warned = check(QUADRATIC);
    assert!(
        warned.contains("warning: ")
            && warned.contains("tenants.acme.deny[0].when")
            && warned.contains("product of their sizes"),
        "{warned}"
    );
    let linear = QUADRATIC.replace(
        "!args.to.all(a, args.to.exists_one(b, b == a))",
        "!args.to.all(a, a.endsWith('@example.com'))",
    );
    assert_eq!(check(&linear), "");
}
