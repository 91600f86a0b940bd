//! The conditions' unit tests: compiling, both evaluators held to each other, budgets.

use std::{
    collections::BTreeSet,
    time::{Duration, SystemTime},
};

use serde_json::json;

use super::{compile::SHALLOW_OPENERS, *};
use crate::{
    allocations::allocations_in,
    identity::{AuthMethod, Caller},
};

fn caller() -> Caller {
    Caller {
        tenant: "acme".into(),
        subject: "alice".to_owned(),
        agent: "support-bot".into(),
        scopes: BTreeSet::from(["refunds:write".to_owned()]),
        method: AuthMethod::Dev,
        claims: Default::default(),
        token: None,
        delegation: None,
    }
}

fn evaluate(source: &str, args: Option<serde_json::Value>) -> Evaluation {
    let caller = caller();
    let tool = ToolFacts {
        name: "refund",
        version: "1.0.0",
        risk_level: "WRITE_CONFIRMED",
    };
    let input = match &args {
        None => Input::listing(&caller, tool),
        Some(args) => Input::of_call(
            &caller,
            tool,
            CallFacts {
                args,
                now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000),
                run_id: "run-1",
            },
        ),
    };
    Condition::compile(source).unwrap().evaluate(&input)
}

/// Both evaluators' answers for `source` on `args`: in place (when it can be) and by the
/// interpreter alone.
fn both(source: &str, args: &serde_json::Value) -> (Evaluation, Evaluation) {
    let caller = caller();
    let tool = ToolFacts {
        name: "send",
        version: "1",
        risk_level: "WRITE_CONFIRMED",
    };
    let call = CallFacts {
        args,
        now: SystemTime::UNIX_EPOCH,
        run_id: "run-1",
    };
    let condition = Condition::compile(source).unwrap();
    let input = Input::of_call(&caller, tool, call);
    (condition.evaluate(&input), condition.interpret(&input))
}

/// An evaluation's work is bounded, not only its expression's shape: a rule quadratic in the
/// arguments fails (decided closed) once it has taken its budget, at once and alike in both
/// evaluators, whatever `&&` and `||` around it would absorb; the same rule on arguments of
/// a sensible size, and a linear rule on large ones, are decided as always.
#[test]
fn an_evaluation_stops_at_its_budget() {
    let recipients = |n: usize, twice: bool| {
        let mut to: Vec<String> = (0..n).map(|i| format!("r{i}@example.com")).collect();
        if twice {
            to.push("r0@example.com".into());
        }
        json!({ "to": to, "blob": "x".repeat(200_000) })
    };
    let unique = "args.to.all(a, args.to.exists_one(b, b == a))";
    let failed = |evaluation: &Evaluation| matches!(evaluation, Evaluation::Failed(why) if why.contains("steps"));
    for source in [
        unique.to_owned(),
        format!("{unique} || true"),
        format!("true && ({unique} || true)"),
        "args.to.all(a, a in args.to)".to_owned(),
        "args.to.exists(a, args.blob.contains(a))".to_owned(),
        "args.to.map(a, args.to.filter(b, b == a)).size() > 0".to_owned(),
    ] {
        let (in_place, interpreted) = both(&source, &recipients(15_000, false));
        assert!(failed(&in_place), "{source}: {in_place:?}");
        assert!(failed(&interpreted), "{source}: {interpreted:?}");
    }
    assert_eq!(
        both(unique, &recipients(100, false)),
        (Evaluation::Holds(true), Evaluation::Holds(true))
    );
    assert_eq!(
        both(unique, &recipients(100, true)),
        (Evaluation::Holds(false), Evaluation::Holds(false))
    );
    let linear = "args.to.all(a, a.endsWith('@example.com'))";
    assert_eq!(
        both(linear, &recipients(15_000, false)),
        (Evaluation::Holds(true), Evaluation::Holds(true))
    );
    // Outside a comprehension nothing is charged: each node runs once.
    let once = "args.blob.contains('y') || size(args.to) > 10";
    assert_eq!(
        both(once, &recipients(15_000, false)),
        (Evaluation::Holds(true), Evaluation::Holds(true))
    );
}

#[test]
fn what_may_take_long_is_known_at_load() {
    let compiled = |source: &str| Condition::compile(source).unwrap().may_take_long();
    assert!(compiled("args.to.all(a, a != '')"));
    assert!(
        !compiled("caller.scopes.exists(s, s == 'x')"),
        "the caller's data is bounded"
    );
    assert!(!compiled("args.amount > 100 && 'x' in args.tags"));
    let superlinear = |source: &str| Condition::compile(source).unwrap().grows_superlinearly();
    for quadratic in [
        "args.to.all(a, args.to.exists_one(b, b == a))",
        "args.to.all(a, a in args.to)",
        "args.to.exists(a, args.blob.contains(a))",
        "args.to.filter(a, a != args.from).size() > 0",
    ] {
        assert!(superlinear(quadratic), "{quadratic}");
    }
    for linear in [
        "args.to.all(a, a.endsWith('@acme.com'))",
        "args.groups.all(g, g.members.all(m, m != ''))",
        "args.to.map(a, a.size()).size() == size(args.to)",
        "caller.scopes.all(s, s in ['a', 'b'])",
    ] {
        assert!(!superlinear(linear), "{linear}");
    }
}

#[test]
fn reads_the_call() {
    let args = json!({"amount_cents": 60000, "to": "bob@acme.com", "items": [1, 2]});
    for (source, holds) in [
        ("args.amount_cents > 50000", true),
        ("args.to.endsWith('@acme.com')", true),
        ("!args.to.endsWith('@acme.com')", false),
        (
            "caller.tenant == 'acme' && 'refunds:write' in caller.scopes",
            true,
        ),
        ("caller.agent == 'other'", false),
        (
            "tool.name == 'refund' && tool.risk_level == 'WRITE_CONFIRMED'",
            true,
        ),
        ("run.id == 'run-1'", true),
        ("now > timestamp('2026-01-01T00:00:00Z')", true),
        ("args.items.all(i, i > 0)", true),
        // Whole numbers are ints, as the schema's integers are.
        ("args.amount_cents + 1 == 60001", true),
        ("args.items.map(i, i * 2) == [2, 4]", true),
        ("type(args.amount_cents) == int", true),
        // A loop variable named like a variable is the loop's, also when evaluated.
        ("caller.scopes.exists(args, args == 'refunds:write')", true),
        (
            "args.items.exists(caller, caller == 2) && caller.tenant == 'acme'",
            true,
        ),
        ("has(args.missing)", false),
    ] {
        assert_eq!(
            evaluate(source, Some(args.clone())),
            Evaluation::Holds(holds),
            "{source}"
        );
    }
}

#[test]
fn without_the_call_an_expression_on_it_is_unknown_and_one_on_the_caller_is_decided() {
    assert_eq!(evaluate("args.amount_cents > 1", None), Evaluation::Unknown);
    assert_eq!(evaluate("run.id == 'x'", None), Evaluation::Unknown);
    assert_eq!(evaluate("now > now", None), Evaluation::Unknown);
    assert_eq!(
        evaluate("caller.tenant == 'acme'", None),
        Evaluation::Holds(true)
    );
}

#[test]
fn failures_are_reported_not_decided() {
    let args = json!({"amount_cents": "a lot", "n": 9223372036854775807_i64});
    for source in [
        "args.missing > 1",
        "args.amount_cents > 1",
        "args.n + 1 > 0",
        "args.amount_cents",
        "1 / (size(args) - 2) == 0",
    ] {
        assert!(
            matches!(evaluate(source, Some(args.clone())), Evaluation::Failed(_)),
            "{source}"
        );
    }
}

#[test]
fn load_errors_name_what_and_where() {
    let error = |source: &str| Condition::compile(source).unwrap_err().to_string();
    assert!(error("secrets.key == 1").contains("unknown variable \"secrets\""));
    // Positions are a line and a column, both from 1, in characters.
    let on_line_2 = error("caller.tenant == 'acme' &&\n  secrets.key == 1");
    assert!(
        on_line_2.contains("\"secrets\" at line 2, column 3"),
        "{on_line_2}"
    );
    let after_accent = error("'é' == x");
    assert!(
        after_accent.contains("\"x\" at line 1, column 8"),
        "{after_accent}"
    );
    assert!(error("args.a ==").contains("syntax error"));
    // A syntax error's column is its token's, counted from 1 as the others are: `*` is the
    // 4th character; at the end of the input, the column just past the last character.
    for (source, at) in [
        ("1 +* 2", "line 1, column 4"),
        ("'é' +* 2", "line 1, column 6"),
        ("1 +\n  * 2", "line 2, column 3"),
        ("1 +", "line 1, column 4"),
    ] {
        let message = error(source);
        assert!(
            message.contains(&format!("syntax error at {at}:")),
            "{source:?}: {message}"
        );
    }
    assert!(error("myFn(args.a)").contains("function \"myFn\""));
    assert!(error("").contains("empty"));
    assert!(error(&"a".repeat(MAX_EXPRESSION_BYTES + 1)).contains("longer than"));
    assert!(error("args.a.all(x, args.a.all(y, args.a.all(z, x == y)))").contains("nested deeper"));
    assert!(error("args.a.all(x, x > 0) && x > 0").contains("unknown variable \"x\""));
    assert!(error("{'a': args.a}.?a == 1").contains("syntax error"));
}

fn parens(levels: usize) -> String {
    format!("{}args.n > 1{}", "(".repeat(levels), ")".repeat(levels))
}

fn lists(levels: usize) -> String {
    format!("{}args.n{} != []", "[".repeat(levels), "]".repeat(levels))
}

/// `args.n + args.n + … > 0`: nested nowhere, but its tree is `_>_`, then one `_+_` per
/// term after the first, then `args.n` (a select on an ident): `terms + 2` deep.
fn chain(terms: usize) -> String {
    format!("{} > 0", vec!["args.n"; terms].join(" + "))
}

/// The parser recurses once per nesting level, and the walks and evaluators once per
/// level of the tree: both are bounded at load, by errors naming the limit.
#[test]
fn nesting_and_depth_beyond_the_limits_are_load_errors() {
    for deepest in [parens(MAX_NESTING), lists(MAX_NESTING)] {
        assert!(Condition::compile(&deepest).is_ok(), "{deepest}");
    }
    for too_deep in [parens(MAX_NESTING + 1), lists(MAX_NESTING + 1)] {
        let error = Condition::compile(&too_deep).unwrap_err();
        assert!(matches!(error, CompileError::TooNested), "{error}");
        assert!(
            error.to_string().contains("nested deeper than 24"),
            "{error}"
        );
    }
    assert!(Condition::compile(&chain(MAX_DEPTH - 2)).is_ok());
    let error = Condition::compile(&chain(MAX_DEPTH - 1)).unwrap_err();
    assert!(matches!(error, CompileError::TreeTooDeep { .. }), "{error}");
    assert!(error.to_string().contains("deeper than 48"), "{error}");
    // The longest chain that fits the length limit, far deeper than the limit.
    for longest in [
        format!("{}1 > 0", "1+".repeat(500)),
        format!("args{} > 0", ".a".repeat(500)),
    ] {
        let error = Condition::compile(&longest).unwrap_err();
        assert!(matches!(error, CompileError::TreeTooDeep { .. }), "{error}");
    }
}

/// The deepest expressions accepted compile and evaluate on a thread with the stack of
/// Tokio's threads (2 MiB: its workers evaluate, its blocking threads reload catalogs), in
/// this unoptimised build too, where the parser takes ~200 KiB per nesting level (an
/// optimised build ~8 KiB).
#[test]
fn the_deepest_expressions_accepted_fit_a_tokio_threads_stack() {
    let on_tokio_stack = std::thread::Builder::new().stack_size(2 << 20).spawn(|| {
        let args = json!({"n": 2});
        // The deepest parsed on the calling thread, and the deepest of all.
        let shallow = parens(SHALLOW_OPENERS - 1);
        for source in [
            shallow,
            parens(MAX_NESTING),
            lists(MAX_NESTING),
            chain(MAX_DEPTH - 2),
        ] {
            let with_call = evaluate(&source, Some(args.clone()));
            assert!(
                matches!(with_call, Evaluation::Holds(_)),
                "{source}: {with_call:?}"
            );
            assert_eq!(evaluate(&source, None), Evaluation::Unknown, "{source}");
        }
        // Arguments as deep as stage 2 lets through, compared whole.
        let mut deep = json!(1);
        for _ in 1..crate::settings::MAX_ARGUMENTS_DEPTH_CAP {
            deep = json!([deep]);
        }
        let source = "args.d == args.d && size(args.d) == 1";
        assert_eq!(
            evaluate(source, Some(json!({ "d": deep }))),
            Evaluation::Holds(true)
        );
    });
    on_tokio_stack.unwrap().join().unwrap();
}

/// The in-place path answers as the interpreter does, on expressions made from the shapes
/// it decides and the ones it hands back (mismatched types, missing fields, numbers that
/// are not ints, null), for callers with and without claims, arguments of the expected and
/// unexpected types, and without the call.
#[test]
fn in_place_answers_are_the_interpreters() {
    let mut callers = vec![caller()];
    let mut with_claims = caller();
    with_claims.claims = crate::identity::Claims::new(
        json!({"department": "finance", "level": 3, "tags": ["a"]})
            .as_object()
            .cloned()
            .unwrap(),
    );
    callers.push(with_claims);
    let args = [
        json!({"to": "bob@acme.com", "name": "é☃", "amount_cents": 60000, "n": -3,
               "flag": true, "tags": ["x", "y"], "mixed": [1, "x", 1.0],
               "nested": {"count": 2}, "big": 18446744073709551615_u64, "ratio": 1.5,
               "nul": null}),
        json!({"to": 5, "name": null, "amount_cents": "a lot", "n": 2.0, "flag": "yes",
               "tags": "x", "nested": [], "mixed": {}}),
    ];
    let tool = ToolFacts {
        name: "refund",
        version: "1.0.0",
        risk_level: "WRITE_CONFIRMED",
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let (mut compared, mut in_place) = (0, 0);
    let mut random = Random(0x5eed);
    for _ in 0..4000 {
        let source = random.boolean(3);
        let Ok(condition) = Condition::compile(&source) else {
            continue;
        };
        in_place += usize::from(condition.decided_in_place());
        for caller in &callers {
            let mut inputs = vec![Input::listing(caller, tool)];
            inputs.extend(args.iter().map(|args| {
                Input::of_call(
                    caller,
                    tool,
                    CallFacts {
                        args,
                        now,
                        run_id: "run-1",
                    },
                )
            }));
            for input in &inputs {
                compared += 1;
                assert_eq!(
                    condition.evaluate(input),
                    condition.interpret(input),
                    "{source}"
                );
                assert_eq!(
                    condition.cost(input),
                    condition.interpret_cost(input),
                    "{source}"
                );
            }
        }
    }
    assert!(compared > 10_000, "{compared}");
    assert!(in_place > 2000, "only {in_place} of 4000 decided in place");
}

/// A deterministic generator of expressions.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn pick(&mut self, from: &[&str]) -> String {
        from[self.below(from.len())].to_owned()
    }

    fn any(&mut self, depth: usize) -> String {
        match self.below(4) {
            0 => self.pick(&[
                "caller.tenant",
                "caller.subject",
                "caller.agent",
                "tool.name",
                "tool.version",
                "tool.risk_level",
                "run.id",
                "args.to",
                "args.name",
                "caller.claims.department",
                "caller.claims['level']",
                "'acme'",
                "'alice'",
                "''",
                "'é☃'",
                "args.missing",
                "args.tags[0]",
                "args.tags[5]",
                "'refund'",
                "'bob@acme.com'",
                "caller.claims.tags",
                "caller.scopes",
                "args.nested",
            ]),
            1 => self.pick(&[
                "args.amount_cents",
                "args.n",
                "args.big",
                "args.ratio",
                "1000",
                "-1",
                "0",
                "2",
                "60000",
                "size(caller.scopes)",
                "size(args.to)",
                "args.tags.size()",
                "size(caller.claims)",
                "caller.claims.level",
                "args.nested.count",
                "args.nul",
                "-args.n",
                "size(args.name)",
                "args.mixed[0]",
                "1u",
                "1.0",
                "args.amount_cents + 1",
                "-9223372036854775808",
                "args.n * 3 - 1",
                "args.amount_cents / 7",
                "args.amount_cents % 0",
                "9223372036854775807 + args.n",
                "args.n / 0",
                "size(args.tags) * 2",
            ]),
            2 if depth > 0 => {
                let (c, a, b) = (self.boolean(depth - 1), self.any(0), self.any(0));
                format!("({c} ? {a} : {b})")
            }
            _ => self.boolean(depth.saturating_sub(1)),
        }
    }

    fn boolean(&mut self, depth: usize) -> String {
        let choice = if depth == 0 {
            self.below(2)
        } else {
            self.below(7)
        };
        match choice {
            0 => self.pick(&[
                "true",
                "false",
                "args.flag",
                "has(args.to)",
                "has(caller.claims.department)",
                "has(args.nested.count)",
                "'refunds:write' in caller.scopes",
                "'to' in args",
                "'x' in args.tags",
                "1 in [1, 2]",
                "caller.tenant in ['acme', 'globex']",
                "args.to.endsWith('@acme.com')",
                "caller.agent.startsWith('support')",
                "tool.name.contains('und')",
                "'department' in caller.claims",
                "1 in args.mixed",
                "'x' in args.mixed",
                "args.n in [1, 'x']",
                "has(caller.tenant)",
                "args.to.startsWith(args.name)",
                "caller.scopes.exists(s, s.startsWith('refunds'))",
                "caller.scopes.all(s, s.contains(':'))",
                "args.tags.exists_one(t, t == 'x')",
                "args.mixed.exists(m, m == 1)",
                "args.mixed.all(m, m == 1)",
                "args.nested.exists(k, k == 'count')",
                "args.tags.all(t, args.tags.exists(u, u == t))",
                "caller.subject.matches('^al')",
                r"args.to.matches('[a-z]+@acme\\.com')",
                "args.name.matches('(')",
                "args.tags.map(t, t) == ['x', 'y']",
                "caller.claims.tags.exists(t, t == 'a')",
                "args.n * 3 - 1 == -10",
                "args.amount_cents / 7 == 8571 && args.amount_cents % 7 == 3",
            ]),
            1 => {
                let operator = self.pick(&["==", "!=", "<", "<=", ">", ">="]);
                let (a, b) = (self.any(depth), self.any(depth));
                format!("{a} {operator} {b}")
            }
            2 => format!("!({})", self.boolean(depth - 1)),
            3 => format!(
                "({} && {})",
                self.boolean(depth - 1),
                self.boolean(depth - 1)
            ),
            4 => format!(
                "({} || {})",
                self.boolean(depth - 1),
                self.boolean(depth - 1)
            ),
            5 => format!("{} in [{}, {}]", self.any(0), self.any(0), self.any(0)),
            _ => {
                let test = self.pick(&["startsWith", "endsWith", "contains"]);
                format!("{}.{test}({})", self.any(0), self.any(0))
            }
        }
    }
}

/// Rules on the caller and the tool, the common shapes, cost nothing per call: decided in
/// place, nothing converted to the interpreter's values, nothing allocated.
#[test]
fn conditions_on_the_caller_and_the_tool_allocate_nothing() {
    let caller = caller();
    let tool = ToolFacts {
        name: "refund",
        version: "1.0.0",
        risk_level: "WRITE_CONFIRMED",
    };
    let args = json!({"to": "bob@acme.com", "amount_cents": 60000});
    for source in [
        "caller.agent == 'bot-7'",
        "caller.tenant == 'acme' && 'refunds:write' in caller.scopes",
        "!(caller.tenant in ['globex', 'initech']) || tool.risk_level == 'READ_ONLY'",
        "tool.name.startsWith('ref') && size(caller.scopes) > 0",
        "has(caller.claims.department) ? caller.claims.department == 'finance' : false",
        "caller.scopes.exists(s, s.startsWith('refunds:'))",
        "caller.scopes.all(s, s.contains(':')) && size(caller.scopes) * 2 < 10",
        "caller.subject.matches('^al[a-z]+$')",
    ] {
        let condition = Condition::compile(source).unwrap();
        assert!(condition.decided_in_place(), "{source}");
        let input = Input::listing(&caller, tool);
        // A regex's first search on a thread makes its cache.
        condition.evaluate(&input);
        assert_eq!(
            allocations_in(|| {
                assert!(matches!(
                    input.evaluate_at(|| unreachable!(), &condition),
                    Evaluation::Holds(_)
                ));
            }),
            0,
            "{source}"
        );
    }
    // So do the common rules on the arguments.
    let condition =
        Condition::compile("!args.to.endsWith('@acme.com') || args.amount_cents > 50000").unwrap();
    let call = CallFacts {
        args: &args,
        now: SystemTime::UNIX_EPOCH,
        run_id: "run-1",
    };
    let input = Input::of_call(&caller, tool, call);
    assert_eq!(
        allocations_in(|| assert_eq!(condition.evaluate(&input), Evaluation::Holds(true))),
        0
    );
    // The counter does count: the interpreter allocates.
    assert!(
        allocations_in(|| assert_eq!(condition.interpret(&input), Evaluation::Holds(true))) > 0
    );
}

#[test]
fn what_it_reads_is_known_at_load() {
    let reads_call = |source: &str| Condition::compile(source).unwrap().reads_call();
    assert!(reads_call("args.a > 1"));
    assert!(reads_call("now > timestamp('2026-01-01T00:00:00Z')"));
    assert!(!reads_call("caller.tenant == 'x' && tool.name == 'y'"));
    // A loop variable named like a variable is the loop's.
    assert!(!reads_call("caller.scopes.exists(args, args == 'x')"));
}
