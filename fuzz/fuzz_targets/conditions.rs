//! CEL conditions on arbitrary expressions and arguments: `Condition::compile`, then
//! `evaluate` with and without the call. Input: the expression up to the first NUL byte, the
//! arguments (JSON) after it; arguments that are not a JSON object are evaluated as `{}`.
//! Checks, besides "never panics":
//! - an expression longer than the limit is refused, never compiled;
//! - evaluating twice on the same input gives the same answer;
//! - an expression that does not read the call decides the same with and without it, and one
//!   that does is undecided (`Unknown`) without it;
//! - what is decided in place (without the interpreter) is what the interpreter decides, as a
//!   rule and as a cost, with and without the call.
#![no_main]

use std::{collections::BTreeSet, time::{Duration, SystemTime}};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolgate::{
    conditions::{CallFacts, Condition, Evaluation, Input, MAX_EXPRESSION_BYTES, ToolFacts},
    identity::{AuthMethod, Caller, Claims},
};

fuzz_target!(|data: &[u8]| {
    let (expression, rest) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(expression) = std::str::from_utf8(expression) else {
        return;
    };
    let compiled = Condition::compile(expression);
    if expression.len() > MAX_EXPRESSION_BYTES {
        assert!(compiled.is_err(), "compiled an expression over the limit");
    }
    let Ok(condition) = compiled else {
        return;
    };
    let args = match serde_json::from_slice::<Value>(rest) {
        Ok(args @ Value::Object(_)) => args,
        _ => Value::Object(Default::default()),
    };
    let caller = Caller {
        tenant: "acme".into(),
        subject: "alice".to_owned(),
        agent: "bot".into(),
        scopes: BTreeSet::from(["a".to_owned(), "b".to_owned()]),
        method: AuthMethod::Dev,
        claims: Claims::new(
            serde_json::json!({"department": "finance", "level": 3})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ),
        token: None,
        delegation: None,
    };
    let tool = ToolFacts {
        name: "refund",
        version: "1",
        risk_level: "WRITE_CONFIRMED",
    };
    let call = CallFacts {
        args: &args,
        now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        run_id: "run-1",
    };
    let with_call = Input::of_call(&caller, tool, call);
    let without = Input::listing(&caller, tool);
    for input in [&with_call, &without] {
        assert_eq!(condition.evaluate(input), condition.interpret(input), "{expression}");
        assert_eq!(condition.cost(input), condition.interpret_cost(input), "{expression}");
    }
    let first = condition.evaluate(&with_call);
    assert_eq!(first, condition.evaluate(&with_call), "not deterministic: {expression}");
    let listed = condition.evaluate(&without);
    if condition.reads_call() {
        assert_eq!(listed, Evaluation::Unknown, "{expression}");
    } else {
        assert_eq!(listed, first, "{expression}");
    }
    // The same expression as a quota cost: a number of cells or a reason, never a panic, and
    // never a cell count from a value that is not a whole number.
    let cost = condition.cost(&with_call);
    assert_eq!(cost, condition.cost(&with_call), "not deterministic: {expression}");
    if let Evaluation::Holds(_) = first {
        assert!(cost.is_err(), "a bool is not a cost: {expression}");
    }
});
