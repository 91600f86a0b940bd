//! `toolgate test --config catalog.yaml tests.yaml [--coverage]`: a catalog's test cases, each run
//! through the real chain in explain mode — no backend, no state changed, nothing audited — with
//! a readable diff for every case that fails and a non-zero exit, so catalog changes can be gated
//! in CI. With `--coverage`, every tool must have a case and every deny rule must decide one.
//!
//! The file format is [`TestFile`]; `toolgate schema --tests` prints its JSON Schema
//! (`docs/catalog-tests.schema.json`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::Path,
    sync::Arc,
};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::Failure;
use crate::{
    audit::AuditLog,
    boundary::{
        Boundary, CallRequest, Stores, Turn, approval_condition_location,
        explain::{self, Explanation, Visibility},
    },
    catalog::{AccessList, Catalog},
    clock::SharedClock,
    conditions::Found,
    config::Config,
    emergency::{Authority, NewDeny},
    error::{Reason, Stage, Status},
    executor::Executors,
    identity::{AuthMethod, Caller, split_scopes},
    metrics::Metrics,
    settings::{AuditConfig, AuditSinkConfig, Env, raw::RawFsync},
    tasks::Tasks,
};

/// A file of test cases for one catalog.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestFile {
    /// Format version of this file; must be 1.
    pub version: u32,
    /// The cases, run in order, each on its own (explaining changes no state).
    pub cases: Vec<TestCase>,
}

/// One case: who calls, what, and what the catalog must decide.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    /// What the case shows, e.g. `globex cannot delete tickets`.
    pub name: String,
    /// The caller.
    pub identity: TestIdentity,
    /// The call to explain; leave it out for a case about the visible tools only.
    pub call: Option<TestCall>,
    /// Tools taken to have run before the call in its flow scope, in order (e.g. `[rag_search,
    /// fetch_url]`): the flow rules see their labels, brought by calls `history[0]`, … Without
    /// it, the scope has seen nothing.
    pub history: Option<Vec<String>>,
    /// Emergency denies in force for this case only, as `toolgate deny` would set them: to check
    /// what a deny stops (and what it leaves alone) before setting it in an incident.
    pub emergency_denies: Option<Vec<TestDeny>>,
    /// What must come out.
    pub expect: Expectation,
}

/// An emergency deny, as `toolgate deny` takes it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestDeny {
    /// A glob over catalog tool names, e.g. `send_*`.
    pub tools: String,
    /// Only this tenant's calls.
    pub tenant: Option<String>,
    /// Only this agent's calls.
    pub agent: Option<String>,
    /// Why, as refused calls are told (default `toolgate test`).
    pub reason: Option<String>,
}

/// A caller: tenant, subject, agent and scopes as dev identity gives them, or the claims of a
/// JWT, mapped through the catalog's `identity.jwt.claims` (signature and lifetime are not
/// checked here).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestIdentity {
    pub tenant: Option<String>,
    pub subject: Option<String>,
    pub agent: Option<String>,
    /// A list, or one string separated by commas or spaces.
    pub scopes: Option<Scopes>,
    /// JWT claims, e.g. `{ tenant: acme, sub: alice, scope: "tickets:read" }`.
    pub claims: Option<serde_json::Map<String, Value>>,
}

/// Scopes as a list or as one string.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Scopes {
    List(Vec<String>),
    Text(String),
}

/// A call as the model would propose it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as an object (default `{}`).
    pub arguments: Option<serde_json::Map<String, Value>>,
    /// Or the raw JSON text the model produced (for malformed arguments).
    pub arguments_json: Option<String>,
    /// A version pin.
    pub version: Option<String>,
    pub idempotency_key: Option<String>,
    pub approval_id: Option<String>,
    /// The run (approvals are bound to it); default `toolgate-test`.
    pub run_id: Option<String>,
    /// What the backend returns, to test the output guard: when the call would run, this
    /// output is screened as the sidecar screens it, and `expect.model_text`,
    /// `expect.output_guard` (and a blocked output's status) are checked on the result.
    pub output: Option<String>,
}

/// What the case must decide. Only the fields given are checked.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    /// The status ExecuteTool would return: `OK` (every stage passes: the backend would be
    /// called), `DENIED`, `INVALID_ARGUMENTS`, `APPROVAL_REQUIRED`, …
    pub status: Option<String>,
    /// The `error_type`, e.g. `denied_by_policy`.
    pub error_type: Option<String>,
    /// The stage that refuses, e.g. `access`.
    pub refused_by: Option<String>,
    /// Where the access rule that refuses is defined, e.g. `tenants.globex.deny[0]` (a flow
    /// rule that refuses: `flow.rules[0]`).
    pub rule: Option<String>,
    /// The name of the flow rule that decides the call (denies it or requires its approval).
    pub flow_rule: Option<String>,
    /// The version the call resolves to.
    pub tool_version: Option<String>,
    /// Values the server binds, by dotted path, e.g. `{ filter.tenant: acme }`.
    pub bound_arguments: Option<BTreeMap<String, Value>>,
    /// The final arguments the backend would receive, exactly (canonical, redacted).
    pub arguments: Option<Value>,
    /// The tools the caller's ListTools shows.
    pub tools: Option<ToolsExpectation>,
    /// The text the model gets for `call.output`, exactly, after the output guard.
    pub model_text: Option<String>,
    /// What the output guard finds in `call.output`: each detector that fires and its
    /// number of matches, exactly (`{}`: nothing).
    pub output_guard: Option<BTreeMap<String, usize>>,
}

/// What the caller's ListTools must show.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsExpectation {
    /// Tools that must be listed.
    #[serde(default)]
    pub visible: Vec<String>,
    /// Tools that must not be listed.
    #[serde(default)]
    pub hidden: Vec<String>,
    /// The complete list, in any order.
    pub exactly: Option<Vec<String>>,
}

/// The JSON Schema of the test file format.
pub fn json_schema() -> Value {
    serde_json::to_value(schemars::schema_for!(TestFile)).unwrap_or_default()
}

/// Why a test file cannot be run.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct TestFileError {
    file: String,
    message: String,
}

/// Reads and checks a test file against the catalog's vocabulary (statuses, stages, codes).
pub fn load(path: &Path, catalog: &Catalog) -> Result<TestFile, TestFileError> {
    let file = path.display().to_string();
    let error = |message: String| TestFileError {
        file: file.clone(),
        message,
    };
    let bounds = |err: crate::settings::yaml_bounds::BoundsError| error(err.to_string());
    let text = crate::settings::yaml_bounds::read_bounded(path).map_err(bounds)?;
    // Deep nesting makes the parser's work grow faster than the text: bounded before parsing.
    crate::settings::yaml_bounds::check(&text).map_err(bounds)?;
    let deserializer = serde_yaml_ng::Deserializer::from_str(&text);
    let tests: TestFile = serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        error(format!("{path}: {}", err.into_inner()))
    })?;
    if tests.version != 1 {
        return Err(error(format!(
            "version: unsupported test file version {}; this toolgate reads version 1",
            tests.version
        )));
    }
    for (i, case) in tests.cases.iter().enumerate() {
        check_case(case, catalog).map_err(|m| error(format!("cases[{i}] ({}): {m}", case.name)))?;
    }
    Ok(tests)
}

fn check_case(case: &TestCase, catalog: &Catalog) -> Result<(), String> {
    let expect = &case.expect;
    let about_call = expect.status.is_some()
        || expect.error_type.is_some()
        || expect.refused_by.is_some()
        || expect.rule.is_some()
        || expect.flow_rule.is_some()
        || expect.tool_version.is_some()
        || expect.bound_arguments.is_some()
        || expect.arguments.is_some()
        || expect.model_text.is_some()
        || expect.output_guard.is_some();
    match (&case.call, about_call, &expect.tools) {
        (None, true, _) => return Err("expects a call's outcome but has no call".into()),
        (None, false, None) | (Some(_), false, None) => {
            return Err("expects nothing: give expect.status, expect.tools, …".into());
        }
        _ => {}
    }
    if let Some(history) = &case.history {
        if case.call.is_none() {
            return Err("gives a history but no call to explain after it".into());
        }
        if let Some(name) = history.iter().find(|name| !catalog.contains(name)) {
            return Err(format!("history: no tool {name:?} in the catalog"));
        }
    }
    if let Some(call) = &case.call
        && call.arguments.is_some()
        && call.arguments_json.is_some()
    {
        return Err("give call.arguments or call.arguments_json, not both".into());
    }
    let gives_output = case.call.as_ref().is_some_and(|c| c.output.is_some());
    if (expect.model_text.is_some() || expect.output_guard.is_some()) && !gives_output {
        return Err("expects what the model gets, but the call gives no output".into());
    }
    let identity = &case.identity;
    let direct = identity.tenant.is_some()
        || identity.subject.is_some()
        || identity.agent.is_some()
        || identity.scopes.is_some();
    match (&identity.claims, direct) {
        (Some(_), true) => {
            return Err("identity: give claims, or tenant/subject/agent/scopes, not both".into());
        }
        (None, _)
            if identity
                .tenant
                .as_deref()
                .is_none_or(|t| t.trim().is_empty()) =>
        {
            return Err("identity: a tenant is required".into());
        }
        _ => {}
    }
    let statuses = statuses();
    if let Some(status) = &expect.status
        && !statuses.contains(status.as_str())
    {
        return Err(format!(
            "expect.status: unknown status {status:?}; one of {}",
            statuses.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(code) = &expect.error_type
        && !Reason::ALL.iter().any(|r| r.code() == code)
    {
        return Err(format!("expect.error_type: unknown error_type {code:?}"));
    }
    // A sample output can be refused by the result stage (the output guard) too.
    if let Some(stage) = &expect.refused_by
        && !explain::STAGES.iter().any(|s| s.as_str() == stage)
        && !(gives_output && stage == Stage::Result.as_str())
    {
        return Err(format!("expect.refused_by: unknown stage {stage:?}"));
    }
    if let Some(tools) = &expect.tools {
        for name in tools
            .visible
            .iter()
            .chain(&tools.hidden)
            .chain(tools.exactly.iter().flatten())
        {
            if !catalog.contains(name) {
                return Err(format!("expect.tools: no tool {name:?} in the catalog"));
            }
        }
    }
    Ok(())
}

/// Every status a call can end with: OK and the status of each refusal reason.
fn statuses() -> BTreeSet<&'static str> {
    std::iter::once(Status::Ok)
        .chain(Reason::ALL.iter().map(|r| r.status()))
        .map(Status::as_str)
        .collect()
}

/// Runs `tests` against the catalog file (or the embedded demo); prints a line per case, a diff
/// per failure and, with `coverage`, what is not covered. Exit 0 only when all pass.
pub async fn run(config: Option<&Path>, tests: &Path, coverage: bool) -> Result<(), Failure> {
    let env = Env::from_process();
    let config = match config {
        Some(path) => Config::load_file(path, &env),
        None => Config::demo(&env),
    }
    .map_err(Failure::error)?;
    let file = load(tests, &config.catalog).map_err(Failure::error)?;
    let source = config.source.clone();
    let jwt = config.identity.jwt.clone();
    let max_identity_bytes = config.identity.max_identity_bytes;
    let boundary = explaining_boundary(config).await?;
    let mut report = Report::default();
    for (i, case) in file.cases.iter().enumerate() {
        let caller = match caller(&case.identity, jwt.as_ref(), max_identity_bytes) {
            Ok(caller) => Arc::new(caller),
            Err(message) => {
                report.fail(i, case, format!("  identity: {message}\n"));
                continue;
            }
        };
        let denies = match set_denies(&boundary, &caller, case).await {
            Ok(denies) => denies,
            Err(message) => {
                report.fail(i, case, format!("  {message}\n"));
                continue;
            }
        };
        let mut diff = String::new();
        if let Some(call) = &case.call {
            let (turn, request) = (turn(&caller, call), call_request(call));
            let explained = match &case.history {
                None => Ok(boundary.explain(&turn, &request, 0).await),
                Some(history) => boundary.explain_after(&turn, &request, history).await,
            };
            let mut explained = match explained {
                Ok(explained) => explained,
                Err(message) => {
                    report.fail(i, case, format!("  {message}\n"));
                    continue;
                }
            };
            let findings = screen_output(&boundary, &caller, call, &mut explained);
            report.seen_call(&call.name, &explained);
            diff.push_str(&compare_call(&case.expect, &explained));
            diff.push_str(&compare_output(
                &case.expect,
                &explained,
                findings.as_deref(),
            ));
            if !diff.is_empty() {
                let response = crate::server::explain::explanation(explained);
                let _ = writeln!(
                    diff,
                    "  call: {} {} as {}\n  trail:",
                    call.name,
                    arguments_text(call),
                    describe(&caller)
                );
                for line in super::explain::render(&response, &call.name).lines() {
                    let _ = writeln!(diff, "    {line}");
                }
            }
        }
        if let Some(tools) = &case.expect.tools {
            let (listing, _) = boundary.explain_visibility(&caller);
            report.seen_listing(&listing);
            diff.push_str(&compare_tools(tools, &listing, &caller));
        }
        for id in denies {
            // Each case starts with none in force.
            let _ = boundary
                .emergency_denies()
                .clear(&id, &Authority::Platform)
                .await;
        }
        if diff.is_empty() {
            println!("ok    {}", case.name);
            report.passed += 1;
        } else {
            report.fail(i, case, diff);
        }
    }
    let tests_name = tests.display();
    println!(
        "{tests_name} against {source}: {} passed, {} failed",
        report.passed,
        report.failed.len()
    );
    let mut ok = report.failed.is_empty();
    if coverage {
        let catalog = boundary.catalog();
        ok &= print_coverage(&catalog.catalog, &report);
    }
    // The diffs and the count are on stdout already.
    match ok {
        true => Ok(()),
        false => Err(Failure::Reported),
    }
}

/// Sets the case's emergency denies (in the explaining boundary's memory); their ids, to clear
/// once the case is done. On an invalid one, those set so far are cleared and the case fails.
async fn set_denies(
    boundary: &Boundary,
    caller: &Caller,
    case: &TestCase,
) -> Result<Vec<String>, String> {
    let denies = boundary.emergency_denies();
    let mut ids = Vec::new();
    for (i, deny) in case.emergency_denies.iter().flatten().enumerate() {
        let new = NewDeny {
            tools: deny.tools.clone(),
            tenant: deny.tenant.clone(),
            agent: deny.agent.clone(),
            reason: deny
                .reason
                .clone()
                .unwrap_or_else(|| "toolgate test".into()),
            ttl: None,
            cancel_running: false,
        };
        match denies.set(new, caller, &Authority::Platform).await {
            Ok(set) => ids.push(set.id),
            Err(err) => {
                for id in ids {
                    let _ = denies.clear(&id, &Authority::Platform).await;
                }
                return Err(format!("emergency_denies[{i}]: {err}"));
            }
        }
    }
    Ok(ids)
}

/// A boundary on the catalog with fresh, empty state, whose backends are never called (cases
/// are only explained) and whose audit goes nowhere.
pub(crate) async fn explaining_boundary(config: Config) -> anyhow::Result<Arc<Boundary>> {
    let clock = SharedClock::system();
    // A group nobody stops: the writer discards, and ends when the boundary (its queue) goes.
    let audit = AuditLog::start(
        &AuditConfig {
            sink: AuditSinkConfig::None,
            queue_capacity: 1,
            authentication_failures: config.audit.authentication_failures,
            fail_closed: false,
            fsync: RawFsync::Never,
        },
        &Tasks::new(),
    )
    .await?;
    // Always in memory, even for a catalog whose state is in Redis: each case starts from
    // empty state, and a test run must never read or touch what the replicas share.
    let stores = Stores::new(
        crate::state::Backend::Memory,
        &clock,
        config.approvals.budget,
        config.limits.idempotency_budget(),
    );
    Ok(Arc::new(Boundary::new(
        config.catalog,
        config.limits,
        stores,
        Executors::default(),
        audit,
        clock,
        &Metrics::new(),
    )))
}

fn caller(
    identity: &TestIdentity,
    jwt: Option<&crate::identity::JwtSettings>,
    max_identity_bytes: usize,
) -> Result<Caller, String> {
    if let Some(claims) = &identity.claims {
        let jwt = jwt.ok_or("claims given, but the catalog has no identity.jwt to map them")?;
        return jwt
            .caller_from_claims(&Value::Object(claims.clone()), max_identity_bytes)
            .map_err(|err| err.to_string());
    }
    Ok(Caller {
        tenant: identity.tenant.as_deref().unwrap_or_default().into(),
        subject: identity.subject.clone().unwrap_or_default(),
        agent: identity.agent.as_deref().unwrap_or_default().into(),
        scopes: match &identity.scopes {
            Some(Scopes::List(list)) => list.iter().cloned().collect(),
            Some(Scopes::Text(text)) => split_scopes(text),
            None => BTreeSet::new(),
        },
        method: AuthMethod::Dev,
        claims: Default::default(),
    })
}

fn turn(caller: &Arc<Caller>, call: &TestCall) -> Turn {
    Turn {
        // Catalog tests decide calls as the gRPC door's callers make them.
        door: crate::identity::Door::Grpc,
        caller: caller.clone(),
        run_id: call.run_id.as_deref().unwrap_or("toolgate-test").into(),
        step: 0,
        catalog_revision: None,
        deadline: None,
        trace_parent: opentelemetry::Context::new(),
    }
}

fn call_request(call: &TestCall) -> CallRequest {
    CallRequest {
        call_id: String::new(),
        name: call.name.clone(),
        arguments_json: arguments_text(call),
        version: call.version.clone(),
        idempotency_key: call.idempotency_key.clone(),
        approval_id: call.approval_id.clone(),
    }
}

fn arguments_text(call: &TestCall) -> String {
    match (&call.arguments_json, &call.arguments) {
        (Some(text), _) => text.clone(),
        (None, Some(map)) => Value::Object(map.clone()).to_string(),
        (None, None) => "{}".to_owned(),
    }
}

fn describe(caller: &Caller) -> String {
    let scopes: Vec<&str> = caller.scopes.iter().map(String::as_str).collect();
    format!(
        "tenant {:?}, subject {:?}, agent {:?}, scopes [{}]",
        caller.tenant,
        caller.subject,
        caller.agent,
        scopes.join(", ")
    )
}

/// A case's sample output, screened as the sidecar screens the output of a call that runs:
/// the explanation's outcome becomes what the model would get. `None` without an output or
/// when the call would not run.
fn screen_output(
    boundary: &Boundary,
    caller: &Caller,
    call: &TestCall,
    explained: &mut Explanation,
) -> Option<Vec<crate::output_guard::Finding>> {
    let output = call.output.as_ref()?;
    if !explained.would_execute {
        return None;
    }
    let catalog = boundary.catalog();
    let outcome = &explained.outcome;
    let tool = catalog
        .catalog
        .resolve(&call.name, Some(&outcome.tool_version), &caller.tenant)
        .ok()?;
    let (result, findings) = crate::boundary::output_guard::screen(tool, Ok(output.clone()));
    let (call_id, name, version) = (
        outcome.call_id.clone(),
        outcome.tool.clone(),
        outcome.tool_version.clone(),
    );
    explained.outcome = match result {
        Ok(text) => crate::outcome::CallOutcome::ok(call_id, name, version, text),
        Err(refusal) => crate::outcome::CallOutcome::refused(call_id, name, version, refusal),
    };
    Some(findings)
}

fn compare_output(
    expect: &Expectation,
    explained: &Explanation,
    findings: Option<&[crate::output_guard::Finding]>,
) -> String {
    let mut diff = String::new();
    let Some(findings) = findings else {
        if expect.model_text.is_some() || expect.output_guard.is_some() {
            diff.push_str("  model_text: the call would not run, so its output was not screened\n");
        }
        return diff;
    };
    if let Some(expected) = &expect.model_text
        && *expected != explained.outcome.model_text
    {
        let _ = writeln!(
            diff,
            "  model_text: expected {expected:?}, got {:?}",
            explained.outcome.model_text
        );
    }
    if let Some(expected) = &expect.output_guard {
        let got: BTreeMap<String, usize> = findings
            .iter()
            .map(|f| (f.detector.to_string(), f.matches))
            .collect();
        if *expected != got {
            let _ = writeln!(diff, "  output_guard: expected {expected:?}, got {got:?}");
        }
    }
    diff
}

/// Every expected field that differs, one line each: `field: expected X, got Y`.
fn compare_call(expect: &Expectation, explained: &Explanation) -> String {
    let mut diff = String::new();
    let outcome = &explained.outcome;
    let refusal = outcome.refusal.as_ref();
    let mut check = |field: &str, expected: Option<String>, got: String| {
        if let Some(expected) = expected
            && expected != got
        {
            let got = if got.is_empty() { "(none)".into() } else { got };
            let _ = writeln!(diff, "  {field}: expected {expected}, got {got}");
        }
    };
    check(
        "status",
        expect.status.clone(),
        outcome.status.as_str().to_owned(),
    );
    check(
        "error_type",
        expect.error_type.clone(),
        refusal
            .map(|r| r.reason.code().to_owned())
            .unwrap_or_default(),
    );
    check(
        "refused_by",
        expect.refused_by.clone(),
        refusal
            .map(|r| r.stage.as_str().to_owned())
            .unwrap_or_default(),
    );
    check(
        "rule",
        expect.rule.clone(),
        explained
            .deciding_rule()
            .map(|r| r.location.clone())
            .unwrap_or_default(),
    );
    check(
        "flow_rule",
        expect.flow_rule.clone(),
        explained
            .flow
            .as_ref()
            .and_then(|f| f.rule.as_ref())
            .map(|(name, _, _)| name.clone())
            .unwrap_or_default(),
    );
    check(
        "tool_version",
        expect.tool_version.clone(),
        outcome.tool_version.clone(),
    );
    if let Some(expected) = &expect.bound_arguments {
        let bound: BTreeMap<String, Value> = explained
            .stages
            .iter()
            .flat_map(|s| &s.bound)
            .map(|b| (b.path.clone(), b.value.clone()))
            .collect();
        for (path, value) in expected {
            match bound.get(path) {
                Some(got) if got == value => {}
                Some(got) => {
                    let _ = writeln!(
                        diff,
                        "  bound_arguments.{path}: expected {value}, got {got}"
                    );
                }
                None => {
                    let _ = writeln!(
                        diff,
                        "  bound_arguments.{path}: expected {value}, got nothing bound (the call did not reach bind, or the tool binds no {path})"
                    );
                }
            }
        }
    }
    if let Some(expected) = &expect.arguments {
        let mut expected = expected.clone();
        crate::canonical::normalize(&mut expected);
        match &explained.arguments {
            Some(got) if *got == expected => {}
            Some(got) => {
                let _ = writeln!(
                    diff,
                    "  arguments: expected {}, got {}",
                    crate::canonical::to_string(&expected),
                    crate::canonical::to_string(got)
                );
            }
            None => {
                let _ = writeln!(
                    diff,
                    "  arguments: expected {}, got none (refused before bind)",
                    crate::canonical::to_string(&expected)
                );
            }
        }
    }
    diff
}

fn compare_tools(expect: &ToolsExpectation, listing: &[Visibility], caller: &Caller) -> String {
    let mut diff = String::new();
    let visible: BTreeSet<&str> = listing
        .iter()
        .filter(|t| t.hidden_by.is_none())
        .map(|t| t.name.as_str())
        .collect();
    let why_hidden = |name: &str| {
        listing
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.hidden_by.as_ref())
            .map(|r| format!("hidden by {} [{}]: {}", r.stage, r.reason.code(), r.message))
            .unwrap_or_else(|| "not in the catalog".to_owned())
    };
    for name in &expect.visible {
        if !visible.contains(name.as_str()) {
            let _ = writeln!(
                diff,
                "  tools: expected {name} visible, got {}",
                why_hidden(name)
            );
        }
    }
    for name in &expect.hidden {
        if visible.contains(name.as_str()) {
            let _ = writeln!(diff, "  tools: expected {name} hidden, got visible");
        }
    }
    if let Some(exactly) = &expect.exactly {
        let expected: BTreeSet<&str> = exactly.iter().map(String::as_str).collect();
        if expected != visible {
            let missing: Vec<_> = expected.difference(&visible).collect();
            let extra: Vec<_> = visible.difference(&expected).collect();
            let _ = writeln!(
                diff,
                "  tools: expected exactly {expected:?}, got {visible:?} (missing {missing:?}, extra {extra:?})"
            );
        }
    }
    if !diff.is_empty() {
        let _ = writeln!(diff, "  as {}", describe(caller));
    }
    diff
}

/// What the cases covered, and the failures.
#[derive(Default)]
struct Report {
    passed: usize,
    failed: Vec<String>,
    called: BTreeSet<String>,
    deny_rules_matched: BTreeSet<String>,
    /// Conditions (by location) seen true, and seen false, in some case.
    conditions_held: BTreeSet<String>,
    conditions_not_held: BTreeSet<String>,
    /// Flow rules (by location) that decided some case.
    flow_rules_fired: BTreeSet<String>,
}

impl Report {
    fn fail(&mut self, index: usize, case: &TestCase, diff: String) {
        println!("FAIL  {} (cases[{index}])\n{diff}", case.name);
        self.failed.push(case.name.clone());
    }

    fn seen_call(&mut self, name: &str, explained: &Explanation) {
        self.called.insert(name.to_owned());
        for evaluated in &explained.conditions {
            match evaluated.value {
                Ok(Found::Holds(true)) => self.conditions_held.insert(evaluated.location.clone()),
                Ok(Found::Holds(false)) => {
                    self.conditions_not_held.insert(evaluated.location.clone())
                }
                // An error decides closed; it shows neither way the condition can go. A cost is
                // not a rule.
                Ok(Found::Cost(_)) | Err(_) => false,
            };
        }
        if let Some(rule) = explained.deciding_rule()
            && rule.effect == "deny"
        {
            self.deny_rules_matched.insert(rule.location.clone());
        }
        if let Some((_, location, _)) = explained.flow.as_ref().and_then(|f| f.rule.as_ref()) {
            self.flow_rules_fired.insert(location.clone());
        }
    }

    fn seen_listing(&mut self, listing: &[Visibility]) {
        for rule in listing.iter().filter_map(|t| t.rule.as_ref()) {
            if rule.effect == "deny" {
                self.deny_rules_matched.insert(rule.location.clone());
            }
        }
    }
}

/// Every access list of the catalog: global, tenants', agents'.
fn access_lists(catalog: &Catalog) -> impl Iterator<Item = &AccessList> {
    std::iter::once(&catalog.policy)
        .chain(catalog.tenants.values().map(|t| &t.access))
        .chain(catalog.agents.named.values())
        .chain(catalog.agents.default.iter())
}

/// Every deny rule of the catalog, by location.
fn deny_rules(catalog: &Catalog) -> Vec<(String, String)> {
    access_lists(catalog)
        .flat_map(|list| &list.deny)
        .map(|p| (p.location.clone(), p.text.clone()))
        .collect()
}

/// Every condition of the catalog: (location, expression), once per entry.
fn conditions(catalog: &Catalog) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = access_lists(catalog)
        .flat_map(|list| list.deny.iter().chain(list.allow.iter().flatten()))
        .filter_map(|p| Some((p.location.clone(), p.when.as_ref()?.source().to_owned())))
        .collect();
    found.extend(catalog.versions().filter_map(|tool| {
        let when = tool.approval_when.as_ref()?;
        Some((approval_condition_location(tool), when.source().to_owned()))
    }));
    found.sort();
    found.dedup();
    found
}

/// Prints coverage; true when every tool has a case, every deny rule decided one and every
/// condition held in one case and did not in another.
fn print_coverage(catalog: &Catalog, report: &Report) -> bool {
    let tools: BTreeSet<&str> = catalog.names().chain(catalog.unavailable_names()).collect();
    let uncovered: Vec<&str> = tools
        .iter()
        .filter(|t| !report.called.contains(**t))
        .copied()
        .collect();
    let rules = deny_rules(catalog);
    let unmatched: Vec<&(String, String)> = rules
        .iter()
        .filter(|(location, _)| !report.deny_rules_matched.contains(location))
        .collect();
    println!(
        "coverage: {}/{} tools have a case; {}/{} deny rules decided a case",
        tools.len() - uncovered.len(),
        tools.len(),
        rules.len() - unmatched.len(),
        rules.len()
    );
    for tool in &uncovered {
        println!("  no case calls tool {tool}");
    }
    for (location, pattern) in &unmatched {
        println!("  deny rule {location} ({pattern:?}) decided no case");
    }
    let conditions = conditions(catalog);
    let mut half_covered = Vec::new();
    for (location, expression) in &conditions {
        let held = report.conditions_held.contains(location);
        let not_held = report.conditions_not_held.contains(location);
        if !held {
            half_covered.push(format!(
                "  condition {location} ({expression:?}) held in no case"
            ));
        }
        if !not_held {
            half_covered.push(format!(
                "  condition {location} ({expression:?}) was false in no case"
            ));
        }
    }
    if !conditions.is_empty() {
        let both = conditions
            .iter()
            .filter(|(l, _)| {
                report.conditions_held.contains(l) && report.conditions_not_held.contains(l)
            })
            .count();
        println!(
            "conditions: {both}/{} held in one case and were false in another",
            conditions.len()
        );
    }
    for line in &half_covered {
        println!("{line}");
    }
    let flow_rules = catalog.flow.as_deref().map_or(&[][..], |f| &f.rules[..]);
    let unfired: Vec<_> = flow_rules
        .iter()
        .filter(|r| !report.flow_rules_fired.contains(&r.location))
        .collect();
    if !flow_rules.is_empty() {
        println!(
            "flow rules: {}/{} decided a case",
            flow_rules.len() - unfired.len(),
            flow_rules.len()
        );
    }
    for rule in &unfired {
        println!(
            "  flow rule {} ({}) decided no case: give a case a history",
            rule.location, rule.name
        );
    }
    uncovered.is_empty() && unmatched.is_empty() && half_covered.is_empty() && unfired.is_empty()
}
