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

use std::{
    cell::{OnceCell, RefCell},
    collections::HashMap,
    sync::Arc,
    time::SystemTime,
};

use cel::{
    Context, Env, Program, Value,
    common::{
        ast::{EntryExpr, Expr, IdedExpr, MapExpr, StructExpr},
        types::{
            CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString,
            CelTimestamp, CelUInt, DYN_TYPE, INT_TYPE,
        },
        value::{CowVal, Val},
    },
    context::VariableResolver,
};

use crate::identity::Caller;

mod apart;
mod direct;
mod meter;

pub use apart::{Apart, THREAD_NAME};
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

/// What a condition is evaluated on. The variables' values are made when a condition first
/// reads them and shared by every condition evaluated on the same input (a call's rules).
pub struct Input<'a> {
    caller: &'a Caller,
    tool: ToolFacts<'a>,
    call: Option<CallFacts<'a>>,
    /// The caller's value made once for several inputs (ListTools: one caller, every tool).
    shared_caller: Option<&'a CallerValue>,
    /// Each of [`VARIABLES`], once made, in the interpreter's own form (`Err`: it could not be,
    /// e.g. arguments CEL cannot hold). Every condition evaluated on this input borrows it: the
    /// arguments are converted once per call, not once per condition.
    values: [OnceCell<Result<Box<dyn Val + 'a>, String>>; 5],
    /// What was evaluated, when asked for ([`Input::traced`]: explain, catalog tests).
    trace: Option<RefCell<Vec<Evaluated>>>,
}

/// The caller as conditions read it, made when first read and shared by the inputs that are
/// given it ([`Input::listing_sharing`]): listing the catalog for one caller makes it once.
#[derive(Default)]
pub struct CallerValue(OnceCell<Result<Box<dyn Val>, String>>);

/// A condition that was evaluated, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluated {
    /// Where the catalog defines it, e.g. `tenants.acme.deny[1]`.
    pub location: String,
    pub expression: String,
    /// Its value, or why it could not be evaluated.
    pub value: Result<Found, String>,
    /// The variables it read and their values, the arguments whole: whoever shows them redacts
    /// them as records do (explanations do, with the tool's `redact` pointers).
    pub read: Vec<(&'static str, serde_json::Value)>,
}

/// What an expression evaluated to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A rule's or an approval's condition.
    Holds(bool),
    /// A quota cost, in cells.
    Cost(u64),
}

impl<'a> Input<'a> {
    /// Without the call (ListTools, the chain's access stage): conditions reading it are
    /// [`Evaluation::Unknown`].
    pub fn listing(caller: &'a Caller, tool: ToolFacts<'a>) -> Self {
        Input {
            caller,
            tool,
            call: None,
            shared_caller: None,
            values: Default::default(),
            trace: None,
        }
    }

    /// The same, reading the caller from `shared`, made by the first input that needs it.
    pub fn listing_sharing(
        caller: &'a Caller,
        tool: ToolFacts<'a>,
        shared: &'a CallerValue,
    ) -> Self {
        Input {
            shared_caller: Some(shared),
            ..Self::listing(caller, tool)
        }
    }

    /// The same, keeping what is evaluated on it ([`Input::evaluate_at`], [`Input::take_trace`]).
    pub fn traced(self, traced: bool) -> Self {
        Input {
            trace: traced.then(RefCell::default),
            ..self
        }
    }

    /// Evaluates `condition`, defined at `location` (asked for only when traced), keeping its
    /// value when traced.
    pub fn evaluate_at(
        &self,
        location: impl FnOnce() -> String,
        condition: &Condition,
    ) -> Evaluation {
        let evaluation = condition.evaluate(self);
        let value = match &evaluation {
            Evaluation::Holds(holds) => Ok(Found::Holds(*holds)),
            Evaluation::Failed(error) => Err(error),
            Evaluation::Unknown => return evaluation,
        };
        self.record(location, condition, value);
        evaluation
    }

    /// Evaluates the quota cost `condition`, defined at `location`: the cells this call takes,
    /// or why it has none (an error, a negative number, a value that is not an integer).
    pub fn cost_at(
        &self,
        location: impl FnOnce() -> String,
        condition: &Condition,
    ) -> Result<u64, String> {
        let cost = condition.cost(self);
        self.record(
            location,
            condition,
            cost.as_ref().map(|cells| Found::Cost(*cells)),
        );
        cost
    }

    fn record(
        &self,
        location: impl FnOnce() -> String,
        condition: &Condition,
        value: Result<Found, &String>,
    ) {
        if let Some(trace) = &self.trace {
            let read = condition
                .reads
                .iter()
                .map(|&index| (VARIABLES[index], self.shown(index)))
                .collect();
            trace.borrow_mut().push(Evaluated {
                location: location(),
                expression: condition.source().to_owned(),
                value: value.map_err(String::clone),
                read,
            });
        }
    }

    /// `VARIABLES[index]` as JSON, for explanations.
    fn shown(&self, index: usize) -> serde_json::Value {
        let caller = self.caller;
        let call = self.call;
        match index {
            0 => serde_json::json!({
                "tenant": &*caller.tenant,
                "subject": caller.subject,
                "agent": &*caller.agent,
                "scopes": caller.scopes,
                "claims": caller.claims.map(),
            }),
            1 => serde_json::json!({
                "name": self.tool.name,
                "version": self.tool.version,
                "risk_level": self.tool.risk_level,
            }),
            2 => call.map_or(serde_json::Value::Null, |call| call.args.clone()),
            3 => call.map_or(serde_json::Value::Null, |call| {
                serde_json::Value::from(
                    chrono::DateTime::<chrono::Utc>::from(call.now)
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                )
            }),
            _ => call.map_or(
                serde_json::Value::Null,
                |call| serde_json::json!({ "id": call.run_id }),
            ),
        }
    }

    /// What was evaluated so far (empty unless traced).
    pub fn take_trace(&self) -> Vec<Evaluated> {
        self.trace.as_ref().map(RefCell::take).unwrap_or_default()
    }

    /// With the call, once its arguments are validated and bound.
    pub fn of_call(caller: &'a Caller, tool: ToolFacts<'a>, call: CallFacts<'a>) -> Self {
        Input {
            call: Some(call),
            ..Self::listing(caller, tool)
        }
    }

    pub fn caller(&self) -> &'a Caller {
        self.caller
    }

    pub fn tool(&self) -> ToolFacts<'a> {
        self.tool
    }

    /// The value of `VARIABLES[index]`; `None` for the call's without the call.
    fn value(&self, index: usize) -> Option<&Result<Box<dyn Val + 'a>, String>> {
        let call = self.call;
        if index >= 2 && call.is_none() {
            return None;
        }
        Some(match (index, self.shared_caller) {
            (0, Some(shared)) => shared.0.get_or_init(|| Ok(caller_value(self.caller))),
            _ => self.values[index].get_or_init(|| make_value(self, index)),
        })
    }
}

/// The variables one evaluation reads, lent to the interpreter from their [`Input`]: binding
/// them copies nothing.
struct Bound<'i, 'a>([Option<&'i (dyn Val + 'a)>; 5]);

impl VariableResolver for Bound<'_, '_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let index = VARIABLES.iter().position(|name| *name == variable)?;
        self.0[index].map(CowVal::Borrowed)
    }
}

/// What only a call has.
#[derive(Clone, Copy)]
pub struct CallFacts<'a> {
    /// The arguments after schema validation and bind.
    pub args: &'a serde_json::Value,
    /// The boundary clock's time.
    pub now: SystemTime,
    pub run_id: &'a str,
}

/// What an expression may know of the tool.
#[derive(Clone, Copy)]
pub struct ToolFacts<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub risk_level: &'a str,
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
    /// Compiles and checks `source`.
    pub fn compile(source: &str) -> Result<Self, CompileError> {
        if source.len() > MAX_EXPRESSION_BYTES {
            return Err(CompileError::TooLong(source.len()));
        }
        if source.trim().is_empty() {
            return Err(CompileError::Empty);
        }
        let program = parse(source)?;
        let mut check = Check {
            program: &program,
            bound: Vec::new(),
            reads: Vec::new(),
            loops: false,
            args_reads: 0,
            over_args: 0,
            superlinear: false,
        };
        check.walk(program.expression(), 0)?;
        let mut reads = check.reads;
        reads.sort_unstable();
        reads.dedup();
        let metered = meter::rewrite(program.expression());
        Ok(Condition {
            source: source.into(),
            direct: direct::Direct::plan(&metered),
            loops: check.loops,
            superlinear: check.superlinear,
            metered,
            reads,
        })
    }

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

/// The interpreter's value of `VARIABLES[index]` for `input` (the call's only with the call),
/// made directly: the call's strings are borrowed, not copied. The caller's value owns its
/// strings (a few short ones), so it can be shared by the inputs of one listing.
fn make_value<'a>(input: &Input<'a>, index: usize) -> Result<Box<dyn Val + 'a>, String> {
    let call = || input.call.ok_or("the call is not known here");
    Ok(match index {
        0 => caller_value(input.caller),
        1 => map([
            ("name", borrowed(input.tool.name)),
            ("version", borrowed(input.tool.version)),
            ("risk_level", borrowed(input.tool.risk_level)),
        ]),
        2 => json(call()?.args),
        3 => Box::new(CelTimestamp::from(
            chrono::DateTime::<chrono::Utc>::from(call()?.now).fixed_offset(),
        )),
        _ => map([("id", borrowed(call()?.run_id))]),
    })
}

fn caller_value(caller: &Caller) -> Box<dyn Val> {
    let owned = |text: &str| -> Box<dyn Val> { Box::new(CelString::from(text.to_owned())) };
    let scopes: Vec<Box<dyn Val>> = caller.scopes.iter().map(|s| owned(s)).collect();
    let claims = match caller.claims.map() {
        None => Box::new(CelMap::from(HashMap::new())),
        Some(claims) => owned_json_object(claims),
    };
    map([
        ("tenant", owned(&caller.tenant)),
        ("subject", owned(&caller.subject)),
        ("agent", owned(&caller.agent)),
        ("scopes", Box::new(CelList::from(scopes))),
        ("claims", claims),
    ])
}

fn borrowed(text: &str) -> Box<dyn Val + '_> {
    Box::new(CelString::from(text))
}

/// A map with these field names.
fn map<'a, const N: usize>(entries: [(&'static str, Box<dyn Val + 'a>); N]) -> Box<dyn Val + 'a> {
    let entries: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = entries
        .into_iter()
        .map(|(name, value)| (CelMapKey::String(CelString::from(name)), value))
        .collect();
    Box::new(CelMap::from(entries))
}

/// JSON as CEL sees it: a whole number is an `int` (a `uint` only above the `int` range), so
/// `args.n + 1` adds two ints; a number with a fraction or an exponent is a `double`. (The
/// generic serde conversion makes every non-negative integer a `uint`, which no `int` literal
/// can be added to.) Strings are borrowed. Depth is bounded by the arguments' limits.
fn json(value: &serde_json::Value) -> Box<dyn Val + '_> {
    use serde_json::Value as Json;
    match value {
        Json::String(s) => borrowed(s),
        Json::Array(items) => Box::new(CelList::from(items.iter().map(json).collect::<Vec<_>>())),
        Json::Object(map) => Box::new(CelMap::from(
            map.iter()
                .map(|(key, value)| {
                    (
                        CelMapKey::String(CelString::from(key.as_str())),
                        json(value),
                    )
                })
                .collect::<HashMap<_, _>>(),
        )),
        scalar => json_scalar(scalar),
    }
}

/// The same, owning its strings (the caller's claims, kept with the caller's value).
fn owned_json(value: &serde_json::Value) -> Box<dyn Val> {
    use serde_json::Value as Json;
    match value {
        Json::String(s) => Box::new(CelString::from(s.clone())),
        Json::Array(items) => Box::new(CelList::from(
            items.iter().map(owned_json).collect::<Vec<_>>(),
        )),
        Json::Object(map) => owned_json_object(map),
        scalar => json_scalar(scalar),
    }
}

fn owned_json_object(map: &serde_json::Map<String, serde_json::Value>) -> Box<dyn Val> {
    Box::new(CelMap::from(
        map.iter()
            .map(|(key, value)| {
                (
                    CelMapKey::String(CelString::from(key.clone())),
                    owned_json(value),
                )
            })
            .collect::<HashMap<_, _>>(),
    ))
}

fn json_scalar(value: &serde_json::Value) -> Box<dyn Val> {
    use serde_json::Value as Json;
    match value {
        Json::Bool(b) => Box::new(CelBool::from(*b)),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(int), _) => Box::new(CelInt::from(int)),
            (None, Some(uint)) => Box::new(CelUInt::from(uint)),
            _ => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        },
        _ => Box::new(CelNull),
    }
}

/// The stack a deep expression is parsed on. The parser recurses several rule functions deep
/// per nesting level: ~200 KiB a level in an unoptimised build (the fuzz targets, the tests),
/// ~8 KiB in an optimised one, so [`MAX_NESTING`] needs ~6 MiB at worst, more than the 2 MiB
/// of the Tokio blocking thread a reload compiles on. Pages it does not touch are never
/// resident.
const PARSE_STACK_BYTES: usize = 16 << 20;

/// Each nesting level opens with one of these, so an expression with `n` of them nests at
/// most `n + 1` deep.
const OPENERS: &[u8] = b"([{?";

/// Below this many openers an expression is parsed on the calling thread: at most 4 levels,
/// ~1.3 MiB unoptimised. A thread of its own made a parse 0.42 ms instead of 0.20 (unoptimised),
/// which nearly every real condition does without.
const SHALLOW_OPENERS: usize = 4;

/// Parses `source`, refusing nesting beyond [`MAX_NESTING`] and trees deeper than
/// [`MAX_DEPTH`] before anything else walks them; an expression that may nest deeply, on a
/// thread of its own (see [`PARSE_STACK_BYTES`]). A chain of operators without nesting costs
/// the parser (and dropping its tree) far less a level: the longest the length limit allows
/// is refused in the unit tests on a 2 MiB stack, unoptimised.
fn parse(source: &str) -> Result<Program, CompileError> {
    let openers = source.bytes().filter(|b| OPENERS.contains(b)).count();
    if openers < SHALLOW_OPENERS {
        return parse_here(source, openers);
    }
    std::thread::scope(|scope| {
        let parser = std::thread::Builder::new()
            .name("toolgate-cel-parse".to_owned())
            .stack_size(PARSE_STACK_BYTES)
            .spawn_scoped(scope, || parse_here(source, openers))
            .map_err(|err| CompileError::Parser(format!("cannot start its thread: {err}")))?;
        // The parser is third-party code fed the catalog: a panic in it refuses the expression.
        parser
            .join()
            .unwrap_or_else(|_| Err(CompileError::Parser("it failed".to_owned())))
    })
}

fn parse_here(source: &str, openers: usize) -> Result<Program, CompileError> {
    // The parser's own recursion limit counts `expr` rules entered beyond the limit given
    // plus one: the whole expression is one, each level of nesting one more. Parsing once
    // with it bounds the recursion of the parse that builds the program (`Env::compile`
    // takes no limit); an expression with fewer openers cannot be too deep.
    if openers >= MAX_NESTING
        && let Err(errors) = env()
            .parser()
            .max_recursion_depth(MAX_NESTING as u16)
            .parse(source)
    {
        let nested = errors
            .errors
            .iter()
            .any(|error| error.msg.contains("Recursion limit"));
        return Err(if nested {
            CompileError::TooNested
        } else {
            CompileError::Syntax(syntax_message(&errors))
        });
    }
    let program = env()
        .compile(source)
        .map_err(|errors| CompileError::Syntax(syntax_message(&errors)))?;
    if let Some(too_deep) = deeper_than(program.expression(), MAX_DEPTH) {
        return Err(CompileError::TreeTooDeep {
            position: position(&program, too_deep),
        });
    }
    Ok(program)
}

/// The first node found below `limit` levels, if any: measured with a stack of its own, not
/// by recursion, since the tree is not yet known to be shallow.
fn deeper_than(root: &IdedExpr, limit: usize) -> Option<&IdedExpr> {
    let mut pending = vec![(root, 1)];
    while let Some((expr, depth)) = pending.pop() {
        if depth > limit {
            return Some(expr);
        }
        let below = depth + 1;
        match &expr.expr {
            Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => {}
            Expr::Select(select) => pending.push((&select.operand, below)),
            Expr::Call(call) => {
                pending.extend(call.target.iter().map(|target| (&**target, below)));
                pending.extend(call.args.iter().map(|arg| (arg, below)));
            }
            Expr::List(list) => pending.extend(list.elements.iter().map(|e| (e, below))),
            Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
                for entry in entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(entry) => {
                            pending.extend([(&entry.key, below), (&entry.value, below)])
                        }
                        EntryExpr::StructField(field) => pending.push((&field.value, below)),
                    }
                }
            }
            Expr::Comprehension(loop_) => pending.extend(
                [
                    &loop_.iter_range,
                    &loop_.accu_init,
                    &loop_.loop_cond,
                    &loop_.loop_step,
                    &loop_.result,
                ]
                .map(|e| (e, below)),
            ),
        }
    }
    None
}

/// Where `expr` is written in the program's source, as a line and a column in characters,
/// both from 1 (the parser records the byte offsets where each node starts and stops).
fn position(program: &Program, expr: &IdedExpr) -> String {
    let info = program.source_info();
    let before = info
        .offset_for(expr.id)
        .and_then(|(start, _)| info.source.get(..start as usize));
    let Some(before) = before else {
        return "an unknown position".to_owned();
    };
    let (mut line, mut column) = (1, 1);
    for c in before.chars() {
        if c == '\n' {
            (line, column) = (line + 1, 1);
        } else {
            column += 1;
        }
    }
    format!("line {line}, column {column}")
}

/// The first syntax error, with its line and column (the parser's, both already from 1).
fn syntax_message(errors: &cel::ParseErrors) -> String {
    match errors.errors.first() {
        Some(error) => format!(
            "syntax error at line {}, column {}: {}",
            error.pos.0, error.pos.1, error.msg
        ),
        None => "syntax error".to_owned(),
    }
}

/// The load-time checks, walking the expression once.
struct Check<'p> {
    program: &'p Program,
    /// Comprehension variables in scope.
    bound: Vec<String>,
    /// Indices into [`VARIABLES`] of the variables read.
    reads: Vec<usize>,
    /// Whether it has a comprehension.
    loops: bool,
    /// Reads of `args` so far (to tell whether a comprehension's range reads it).
    args_reads: usize,
    /// Comprehensions over the arguments the walk is in the body of.
    over_args: usize,
    /// Whether a body of such a comprehension reads the arguments.
    superlinear: bool,
}

impl Check<'_> {
    fn position(&self, expr: &IdedExpr) -> String {
        position(self.program, expr)
    }

    fn walk(&mut self, expr: &IdedExpr, loops: usize) -> Result<(), CompileError> {
        match &expr.expr {
            Expr::Unspecified | Expr::Literal(_) => Ok(()),
            Expr::Ident(name) => {
                if self.bound.iter().any(|b| b == name) || TYPE_NAMES.contains(&name.as_str()) {
                    return Ok(());
                }
                let Some(index) = VARIABLES.iter().position(|v| v == name) else {
                    return Err(CompileError::UnknownVariable {
                        name: name.clone(),
                        position: self.position(expr),
                    });
                };
                self.reads.push(index);
                if name == "args" {
                    self.args_reads += 1;
                    self.superlinear |= self.over_args > 0;
                }
                Ok(())
            }
            Expr::Select(select) => self.walk(&select.operand, loops),
            Expr::Call(call) => {
                let name = call.func_name.as_str();
                let operator = name.starts_with(['_', '@', '!', '-']);
                if !operator && !FUNCTIONS.contains(&name) {
                    return Err(CompileError::UnknownFunction {
                        name: name.to_owned(),
                        position: self.position(expr),
                    });
                }
                if let Some(target) = &call.target {
                    self.walk(target, loops)?;
                }
                call.args.iter().try_for_each(|arg| self.walk(arg, loops))
            }
            Expr::List(list) => list.elements.iter().try_for_each(|e| self.walk(e, loops)),
            Expr::Map(map) => map.entries.iter().try_for_each(|entry| match &entry.expr {
                EntryExpr::MapEntry(entry) => {
                    self.walk(&entry.key, loops)?;
                    self.walk(&entry.value, loops)
                }
                EntryExpr::StructField(field) => self.walk(&field.value, loops),
            }),
            Expr::Struct(message) => Err(CompileError::Struct {
                name: message.type_name.clone(),
                position: self.position(expr),
            }),
            Expr::Comprehension(comprehension) => {
                self.loops = true;
                if loops >= MAX_NESTED_LOOPS {
                    return Err(CompileError::TooDeep {
                        position: self.position(expr),
                    });
                }
                // The range is outside the loop's scope; the rest sees its variables.
                let args_before = self.args_reads;
                self.walk(&comprehension.iter_range, loops)?;
                let over_args = usize::from(self.args_reads > args_before);
                self.walk(&comprehension.accu_init, loops)?;
                let scope = self.bound.len();
                self.bound.push(comprehension.iter_var.clone());
                self.bound.extend(comprehension.iter_var2.clone());
                self.bound.push(comprehension.accu_var.clone());
                // What each iteration evaluates; the result, once after the loop.
                self.over_args += over_args;
                let body = [&comprehension.loop_cond, &comprehension.loop_step];
                let walked = body.into_iter().try_for_each(|e| self.walk(e, loops + 1));
                self.over_args -= over_args;
                let walked = walked.and_then(|()| self.walk(&comprehension.result, loops + 1));
                self.bound.truncate(scope);
                walked
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, time::Duration};

    use serde_json::json;

    use super::*;
    use crate::{allocations::allocations_in, identity::AuthMethod};

    fn caller() -> Caller {
        Caller {
            tenant: "acme".into(),
            subject: "alice".to_owned(),
            agent: "support-bot".into(),
            scopes: BTreeSet::from(["refunds:write".to_owned()]),
            method: AuthMethod::Dev,
            claims: Default::default(),
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
        assert!(
            error("args.a.all(x, args.a.all(y, args.a.all(z, x == y)))").contains("nested deeper")
        );
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
            Condition::compile("!args.to.endsWith('@acme.com') || args.amount_cents > 50000")
                .unwrap();
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
}
