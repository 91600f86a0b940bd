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

mod compare;
mod coverage;
mod format;

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
use compare::*;
use coverage::*;
pub use format::*;

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
        token: None,
        delegation: None,
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
