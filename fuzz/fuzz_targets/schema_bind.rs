//! Stages 6-7 on arbitrary arguments: `schema::check` and `bind::apply` for a tool of the demo
//! catalog (plus a few tools with nested and overwritten bindings). Input: byte 0 picks the tool,
//! byte 1 the caller, the rest is `arguments_json`; only arguments that pass stage 2 go on, as in
//! the real chain. Checks, besides "never panics":
//! - bind refuses exactly when the model sent a bound key and the tool denies overrides;
//! - after binding, every bound path holds the caller's (or the constant) value;
//! - binding touches nothing but the bound paths;
//! - arguments that passed the visible schema and were bound satisfy the tool's full schema, so a
//!   backend never receives arguments its own declared schema forbids;
//! - the canonical hash of the bound arguments survives a round trip through its own text.
#![no_main]

use std::{collections::BTreeSet, path::Path, sync::OnceLock};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolgate::{
    boundary::{bind, schema, structure},
    canonical,
    catalog::{BindValue, BoundOverride, ToolVersion},
    config::Config, settings::{Env, LimitsConfig},
    identity::{AuthMethod, Caller},
};

/// Tools whose bindings the demo does not cover: nested paths, constants, overwrite mode.
const EXTRA: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
tools:
  - name: bound
    description: Owner and tenant are bound by the server.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties:
        note: { type: string }
        owner: { type: string }
        scope: { type: object, properties: { tenant: { type: string }, region: { type: string } }, required: [tenant] }
      required: [owner, scope]
      additionalProperties: false
    bind:
      owner: "${caller.subject}"
      scope.tenant: "${caller.tenant}"
  - name: bound_overwrite
    description: Overwrites what the model sends.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    on_bound_argument: overwrite
    input_schema: { type: object, properties: { owner: { type: string }, level: { type: integer } } }
    bind:
      owner: "${caller.subject}"
      level: 3
  - name: deep
    description: A fully bound object nested inside an open one.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    on_bound_argument: overwrite
    input_schema:
      type: object
      properties:
        a:
          type: object
          properties:
            b:
              type: object
              properties:
                c: { type: object }
                d: { type: string }
              required: [c]
              additionalProperties: false
            e: { type: integer }
          required: [b]
        f: { type: array }
      required: [a]
    bind:
      a.b.c: { fixed: [1, 2] }
      a.b.d: "${caller.agent}"
"#;


struct Fixture {
    tools: Vec<(std::sync::Arc<ToolVersion>, jsonschema::Validator)>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let demo = Config::demo(&Env::default()).expect("demo catalog loads");
        let extra = Config::from_yaml(EXTRA, "extra", Path::new("."), &Env::default())
            .expect("extra catalog loads");
        let tools = demo
            .catalog
            .versions()
            .chain(extra.catalog.versions())
            .map(|tool| {
                let full = jsonschema::validator_for(&tool.input_schema).expect("schema compiles");
                (tool.clone(), full)
            })
            .collect();
        Fixture { tools }
    })
}

fn caller(choice: u8) -> Caller {
    let (tenant, subject, agent, scopes): (&str, &str, &str, &[&str]) = match choice % 4 {
        0 => ("acme", "alice", "support-bot", &["tickets:read"]),
        1 => ("globex", "", "", &[]),
        2 => ("t\u{e9}nant \"quoted\"", "\u{0}", "bot\n", &["x"]),
        _ => ("a", "b", "c", &["tickets:read", "tickets:write"]),
    };
    Caller {
        tenant: tenant.into(),
        subject: subject.into(),
        agent: agent.into(),
        scopes: scopes
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<_>>(),
        method: AuthMethod::Dev,
        claims: Default::default(),
        token: None,
        delegation: None,
    }
}

fn at<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
}

fuzz_target!(|data: &[u8]| {
    let [tool_byte, caller_byte, rest @ ..] = data else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let fixture = fixture();
    let (tool, full_schema) = &fixture.tools[usize::from(*tool_byte) % fixture.tools.len()];
    let caller = caller(*caller_byte);
    let limits = LimitsConfig::default();
    let budget = structure::ArgumentsBudget::new(limits.max_parsed_arguments_bytes_in_flight);
    let Ok((arguments, _held)) = structure::check(&tool.name, text, &limits, &budget) else {
        return;
    };
    let map = arguments
        .as_object()
        .expect("stage 2 returns an object")
        .clone();
    let schema_ok = schema::check(tool, &arguments).is_ok();
    let attempted = bind::attempted(tool, &map);
    match bind::apply(tool, &caller, arguments.clone()) {
        Err(refusal) => {
            assert!(
                !attempted.is_empty() && tool.on_bound_argument == BoundOverride::Deny,
                "bind refused without cause: {refusal:?}"
            );
        }
        Ok(bound) => {
            assert!(attempted.is_empty() || tool.on_bound_argument == BoundOverride::Overwrite);
            for binding in &tool.bindings {
                let expected = match &binding.value {
                    BindValue::CallerTenant => Value::from(&*caller.tenant),
                    BindValue::CallerSubject => Value::from(caller.subject.as_str()),
                    BindValue::CallerAgent => Value::from(&*caller.agent),
                    BindValue::Constant(v) => v.clone(),
                };
                assert_eq!(
                    at(&bound, &binding.path),
                    Some(&expected),
                    "{} not bound in {}",
                    binding.dotted,
                    bound
                );
            }
            let bound_map = bound.as_object().expect("still an object");
            assert_eq!(
                bind::without_bound(tool, bound_map),
                bind::without_bound(tool, &map),
                "binding changed more than the bound paths"
            );
            // The chain refuses bound arguments that break the full schema (check_bound); what it
            // lets through must satisfy the tool's own schema.
            if schema_ok && schema::check_bound(tool, &bound).is_ok() {
                let violations: Vec<String> = full_schema
                    .iter_errors(&bound)
                    .map(|e| format!("{}: {e}", e.instance_path().as_str()))
                    .collect();
                assert!(
                    violations.is_empty(),
                    "{}: model arguments {text} passed the visible schema, but after binding \
                     {} breaks the tool's own schema: {violations:?}",
                    tool.name,
                    bound
                );
            }
            let canonical_text = canonical::to_string(&bound);
            let reparsed: Value = serde_json::from_str(&canonical_text).expect("canonical is JSON");
            assert_eq!(
                canonical::sha256_hex(&reparsed),
                canonical::sha256_hex(&bound)
            );
        }
    }
});
