//! Conditions: CEL (Common Expression Language) expressions over a call, written in the catalog
//! (`when:` on allow and deny rules, a tool's `approval.when`), compiled and checked once at load
//! and evaluated by the boundary's stages.
//!
//! An expression sees `caller` (`tenant`, `subject`, `agent`, `scopes`, and `claims`: the
//! verified token's claims the catalog exposes), `tool` (`name`,
//! `version`, `risk_level`), `args` (the arguments after schema validation and bind, so their
//! types and bound values can be trusted), `now` (a timestamp, from the boundary's clock) and
//! `run` (`id`). Nothing else: an unknown variable, a function outside the standard library's
//! documented set, a struct literal, comprehensions nested deeper than [`MAX_NESTED_LOOPS`], an
//! expression longer than [`MAX_EXPRESSION_BYTES`], nested deeper than [`MAX_NESTING`] or
//! deeper than [`MAX_DEPTH`] is a load error naming where it is. What an
//! evaluation costs is then bounded by the expression's size and the arguments' (which
//! `limits.max_argument_bytes` bounds): at most the arguments' length to the power of the
//! nesting.
//!
//! Evaluating never panics on any input and decides nothing by itself: each place says what an
//! error means there, always the closed answer (see [`Evaluation`]).

use std::sync::Arc;

use cel::{
    Context, Env, Value,
    common::{
        ast::IdedExpr,
        types::{DYN_TYPE, INT_TYPE},
    },
};

mod apart;
mod compile;
mod direct;
mod input;
mod meter;
#[cfg(test)]
mod tests;

pub use apart::{Apart, THREAD_NAME};
use input::Bound;
pub use input::{CallFacts, CallerValue, Evaluated, Found, Input, ToolFacts};
pub use meter::MAX_EVALUATION_STEPS;

/// Longest expression accepted, in bytes.
pub const MAX_EXPRESSION_BYTES: usize = 1024;
/// Deepest nesting of parentheses, calls, lists, maps, indexing and `?:`: twice what the CEL
/// spec asks every implementation to support (12), and its 24 ternaries in a row. The parser
/// recurses once per level.
pub const MAX_NESTING: usize = 24;
/// Deepest expression tree, in nodes from the root to the deepest leaf: what a chain of
/// operators builds without nesting (`a + b + c` is two deep in `_+_`). The load-time walks and
/// both evaluators recurse once per level.
pub const MAX_DEPTH: usize = 48;
/// Deepest nesting of comprehensions (`all`, `exists`, `exists_one`, `map`, `filter`).
pub const MAX_NESTED_LOOPS: usize = 2;

/// The variables an expression may read.
pub const VARIABLES: [&str; 5] = ["caller", "tool", "args", "now", "run"];

/// The type names an expression may compare `type(...)` with: constants, not variables.
pub const TYPE_NAMES: [&str; 9] = [
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
];

/// Functions an expression may call beside the operators: the standard library's string,
/// conversion, size and time functions. The macros (`has`, `all`, `exists`, `exists_one`,
/// `map`, `filter`) expand to comprehensions and are allowed too.
pub const FUNCTIONS: [&str; 22] = [
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "dyn",
    "timestamp",
    "duration",
    "getFullYear",
    "getMonth",
    "getDayOfMonth",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "type",
];

/// Why an expression was not accepted at load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("the expression is {0} bytes, longer than {MAX_EXPRESSION_BYTES}")]
    TooLong(usize),
    #[error("the expression is empty")]
    Empty,
    #[error("{0}")]
    Syntax(String),
    #[error("the CEL parser could not parse it: {0}")]
    Parser(String),
    #[error(
        "unknown variable {name:?} at {position}: an expression may read caller, tool, args, now and run"
    )]
    UnknownVariable { name: String, position: String },
    #[error("function {name:?} at {position} is not one conditions may call")]
    UnknownFunction { name: String, position: String },
    #[error("a message literal ({name}) at {position}: conditions have no message types")]
    Struct { name: String, position: String },
    #[error("comprehensions nested deeper than {MAX_NESTED_LOOPS} at {position}")]
    TooDeep { position: String },
    #[error(
        "the expression is nested deeper than {MAX_NESTING} (parentheses, calls, lists, maps, indexing and ?: each count a level)"
    )]
    TooNested,
    #[error(
        "the expression is deeper than {MAX_DEPTH} operations at {position}: split it, or write a long chain of operators as a comprehension"
    )]
    TreeTooDeep { position: String },
}

/// A compiled condition, with its text and what it reads.
pub struct Condition {
    source: Arc<str>,
    /// The expression with its charges ([`meter`]): what both evaluators run.
    metered: IdedExpr,
    /// Whether it has a comprehension: then what it costs grows with the data it iterates over.
    loops: bool,
    /// Whether, inside a comprehension over the arguments, it reads the arguments again: then
    /// what it costs grows with the product of their sizes.
    superlinear: bool,
    /// The variables it reads, as indices into [`VARIABLES`]: only those are given to it.
    reads: Vec<usize>,
    /// The same expression decided in place, when it is in the shapes that can be.
    direct: Option<direct::Direct>,
}

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Condition").field(&self.source).finish()
    }
}

/// What an evaluation found.
#[derive(Debug, Clone, PartialEq)]
pub enum Evaluation {
    /// The expression's value.
    Holds(bool),
    /// It reads the call (`args`, `now`, `run`), which is not known here (ListTools, and the
    /// chain before bind): the place decides again once it is.
    Unknown,
    /// It could not be evaluated (a missing field, a type mismatch, an overflow, a value that is
    /// not a bool), with why.
    Failed(String),
}

/// The environment every condition is compiled and run in: the standard library, no
/// extensions, no optional syntax.
fn env() -> Arc<Env> {
    static ENV: std::sync::OnceLock<Arc<Env>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        // Optional values (`a.?b`) stay out: a missing field is an error, decided closed.
        let mut env = Env::stdlib().with_optional_support(false);
        // Declared once, on a fresh environment: it cannot clash.
        let _ = env.add_overload(
            meter::CHARGE,
            "charge",
            vec![DYN_TYPE, INT_TYPE],
            meter::charge,
        );
        Arc::new(env)
    })
    .clone()
}

impl Condition {
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether it reads the call (`args`, `now`, `run`), and so is decided only once the
    /// arguments are bound, never at list time.
    pub fn reads_call(&self) -> bool {
        self.reads.iter().any(|&index| index >= 2)
    }

    /// Whether evaluating it on a call can take long: it iterates over data of the call, so
    /// its cost grows with the arguments (up to [`MAX_EVALUATION_STEPS`]). Such evaluations run
    /// apart from the async workers ([`Apart`]).
    pub fn may_take_long(&self) -> bool {
        self.loops && self.reads_call()
    }

    /// Whether its cost grows worse than linearly in the arguments: inside a comprehension over
    /// them it reads them again (`args.to.all(a, args.to.exists_one(b, b == a))`, `a in
    /// args.to`). `toolgate check` warns of such conditions: on large arguments they stop at
    /// [`MAX_EVALUATION_STEPS`].
    pub fn grows_superlinearly(&self) -> bool {
        self.superlinear
    }

    /// Evaluates it on `input`, as a rule's or an approval's condition: in place when it can
    /// be (no allocation), by the interpreter otherwise.
    pub fn evaluate(&self, input: &Input<'_>) -> Evaluation {
        match self.in_place(input).map(|d| d.holds(input)) {
            Some(Ok(Some(holds))) => Evaluation::Holds(holds),
            Some(Err(direct::Exhausted)) => Evaluation::Failed(meter::exhausted_message()),
            _ => self.interpret(input),
        }
    }

    /// Evaluates it on `input`, as a quota cost: a whole number of cells, zero or more.
    pub fn cost(&self, input: &Input<'_>) -> Result<u64, String> {
        match self.in_place(input).map(|d| d.cost(input)) {
            Some(Ok(Some(cells))) => Ok(cells),
            Some(Err(direct::Exhausted)) => Err(meter::exhausted_message()),
            _ => self.interpret_cost(input),
        }
    }

    /// Whether it is in the shapes decided in place, without the interpreter.
    pub fn decided_in_place(&self) -> bool {
        self.direct.is_some()
    }

    /// The in-place form, unless the call it reads is not known here: then the answer is the
    /// interpreter's (`Unknown`), even where a short-circuit could decide without the call.
    fn in_place(&self, input: &Input<'_>) -> Option<&direct::Direct> {
        if input.call.is_none() && self.reads_call() {
            return None;
        }
        self.direct.as_ref()
    }

    /// [`Condition::evaluate`] by the interpreter alone: the reference the in-place answers are
    /// held to (unit tests, the `conditions` fuzz target).
    pub fn interpret(&self, input: &Input<'_>) -> Evaluation {
        match self.run(input) {
            Ok(Some(Value::Bool(holds))) => Evaluation::Holds(holds),
            Ok(Some(other)) => Evaluation::Failed(format!(
                "the expression's value is {}, not a bool",
                other.type_of()
            )),
            Ok(None) => Evaluation::Unknown,
            Err(error) => Evaluation::Failed(error),
        }
    }

    /// [`Condition::cost`] by the interpreter alone.
    pub fn interpret_cost(&self, input: &Input<'_>) -> Result<u64, String> {
        match self.run(input)? {
            Some(Value::UInt(cells)) => Ok(cells),
            Some(Value::Int(cells)) => u64::try_from(cells)
                .map_err(|_| format!("the cost is {cells}: a cost cannot be negative")),
            Some(other) => Err(format!(
                "the cost's value is {}, not an int (convert it with int(...))",
                other.type_of()
            )),
            None => Err("the cost reads the call, which is not known here".to_owned()),
        }
    }

    /// Its value on `input`; `None` when it reads the call and `input` has none.
    fn run(&self, input: &Input<'_>) -> Result<Option<Value>, String> {
        let mut bound = Bound([None; 5]);
        for &index in &self.reads {
            match input.value(index) {
                None => return Ok(None),
                Some(Err(message)) => return Err(message.clone()),
                Some(Ok(value)) => bound.0[index] = Some(value.as_ref()),
            }
        }
        let mut context = Context::with_env(env());
        context.set_variable_resolver(&bound);
        // The interpreter is third-party code fed the model's arguments: a panic in it decides
        // closed like any other failure instead of taking the call's task down.
        let (result, exhausted) = meter::interpreted(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Value::resolve(&self.metered, &context)
            }))
        });
        match result {
            _ if exhausted => Err(meter::exhausted_message()),
            Ok(Ok(value)) => Ok(Some(value)),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err("the evaluator failed".to_owned()),
        }
    }
}
