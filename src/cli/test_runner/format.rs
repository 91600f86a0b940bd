//! The test file's format: cases, identities, calls and expectations, checked against the
//! catalog when loaded.

use super::*;

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

pub(super) fn check_case(case: &TestCase, catalog: &Catalog) -> Result<(), String> {
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
pub(super) fn statuses() -> BTreeSet<&'static str> {
    std::iter::once(Status::Ok)
        .chain(Reason::ALL.iter().map(|r| r.status()))
        .map(Status::as_str)
        .collect()
}
