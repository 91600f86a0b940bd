//! What one evaluation may cost. An expression's shape is bounded at load, but not the work it
//! does on the call: a comprehension iterates over arguments the caller chooses, and two nested
//! (`args.to.all(a, args.to.exists_one(b, b == a))`) are quadratic in them. So every
//! evaluation has a budget of [`MAX_EVALUATION_STEPS`], charged as it goes:
//!
//! - a comprehension, before it iterates: the size of its range times the nodes of its loop
//!   condition and step (what one iteration evaluates);
//! - inside a comprehension, an operation whose cost grows with its operands (`in`, the string
//!   tests, `matches`, `size`, comparisons and `+`): the size of each operand that reads data
//!   (a variable, a field, an element).
//!
//! A list or map counts its elements, a string one step per 64 bytes (at least one step for
//! anything). Outside comprehensions every node is evaluated at most once, so the work is
//! bounded by the expression's size and the arguments' already.
//!
//! At load the expression is rewritten once with the charges as calls of `@charge(value,
//! weight)`, which returns its value: both evaluators run that tree (the interpreter calls the
//! function registered under that name; the in-place evaluator plans it as a node), so both
//! charge the same. A call of it cannot be written in a catalog: `@` is not a name CEL source
//! may use, and the load-time check refuses unknown functions before the rewrite.

use std::cell::Cell;

use cel::{
    ExecutionError,
    common::{
        ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue, operators},
        types::{CelBytes, CelInt, CelList, CelMap, CelString},
        value::{CowVal, Val},
    },
};

/// Most steps one evaluation may take; beyond, it stops and fails (decided closed, as any
/// condition that cannot be evaluated is).
pub const MAX_EVALUATION_STEPS: u64 = 1_000_000;

/// The name the charges are called by in the rewritten tree.
pub(super) const CHARGE: &str = "@charge";

/// Bytes of a string that count as one step.
const BYTES_PER_STEP: usize = 64;

/// The operations inside a comprehension whose operands are charged.
const SIZED: [&str; 14] = [
    operators::IN,
    operators::ADD,
    operators::EQUALS,
    operators::NOT_EQUALS,
    operators::LESS,
    operators::LESS_EQUALS,
    operators::GREATER,
    operators::GREATER_EQUALS,
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "size",
    "string",
];

/// A budget of steps for one evaluation.
pub(super) struct Meter {
    left: Cell<u64>,
    exhausted: Cell<bool>,
}

impl Meter {
    pub(super) const fn new() -> Self {
        Meter {
            left: Cell::new(MAX_EVALUATION_STEPS),
            exhausted: Cell::new(false),
        }
    }

    /// Takes `steps`; `false`, and exhausted from then on, when fewer are left.
    pub(super) fn charge(&self, steps: u64) -> bool {
        match self.left.get().checked_sub(steps) {
            Some(left) if !self.exhausted.get() => {
                self.left.set(left);
                true
            }
            _ => {
                self.exhausted.set(true);
                false
            }
        }
    }

    pub(super) fn exhausted(&self) -> bool {
        self.exhausted.get()
    }

    fn reset(&self) {
        self.left.set(MAX_EVALUATION_STEPS);
        self.exhausted.set(false);
    }
}

thread_local! {
    /// The interpreter's meter on this thread: the interpreter calls `@charge` as a plain
    /// function, which can be given nothing else. Evaluations on one thread never overlap.
    static INTERPRETING: (Meter, Cell<bool>) = const { (Meter::new(), Cell::new(false)) };
}

/// Runs `evaluate` (one interpretation) with a fresh budget; its result, and whether the budget
/// ran out (then the result means nothing: charges that failed made parts of it errors, which
/// CEL's `&&` and `||` may have absorbed).
pub(super) fn interpreted<R>(evaluate: impl FnOnce() -> R) -> (R, bool) {
    struct Metering;
    impl Drop for Metering {
        fn drop(&mut self) {
            INTERPRETING.with(|(_, on)| on.set(false));
        }
    }
    INTERPRETING.with(|(meter, on)| {
        meter.reset();
        on.set(true);
    });
    let metering = Metering;
    let result = evaluate();
    drop(metering);
    (result, INTERPRETING.with(|(meter, _)| meter.exhausted()))
}

/// What the evaluation says when its budget ran out.
pub(super) fn exhausted_message() -> String {
    format!(
        "its evaluation took more than {MAX_EVALUATION_STEPS} steps, the most any condition may take on a call (a comprehension over arguments this large, nested, costs too much)"
    )
}

/// `@charge(value, weight)`: charges `weight` steps per unit of `value`'s size to the meter of
/// the evaluation running on this thread, and returns `value` as it is.
pub(super) fn charge<'b, 'v>(
    mut args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let weight = args
        .get(1)
        .and_then(|weight| weight.downcast_ref::<CelInt>())
        .and_then(|weight| u64::try_from(*weight.inner()).ok())
        .unwrap_or(1);
    if args.is_empty() {
        return Err(ExecutionError::function_error(CHARGE, "no value"));
    }
    let value = args.swap_remove(0);
    let steps = weight.saturating_mul(steps_of_val(value.as_ref()));
    // Outside a metered evaluation (there is none) nothing is charged.
    let charged = INTERPRETING.with(|(meter, on)| !on.get() || meter.charge(steps));
    match charged {
        true => Ok(value),
        false => Err(ExecutionError::function_error(CHARGE, exhausted_message())),
    }
}

/// The size of a value as the interpreter holds it, in steps.
fn steps_of_val(value: &dyn Val) -> u64 {
    let size = if let Some(list) = value.downcast_ref::<CelList>() {
        list.inner().len()
    } else if let Some(map) = value.downcast_ref::<CelMap>() {
        map.inner().len()
    } else if let Some(text) = value.downcast_ref::<CelString>() {
        text.inner().len().div_ceil(BYTES_PER_STEP)
    } else if let Some(bytes) = value.downcast_ref::<CelBytes>() {
        bytes.inner().len().div_ceil(BYTES_PER_STEP)
    } else {
        1
    };
    steps(size)
}

/// `size` units in steps: at least one.
pub(super) fn steps(size: usize) -> u64 {
    u64::try_from(size).unwrap_or(u64::MAX).max(1)
}

/// A string's size in steps.
pub(super) fn steps_of_text(text: &str) -> u64 {
    steps(text.len().div_ceil(BYTES_PER_STEP))
}

/// `expr` with its charges: see the module's documentation.
pub(super) fn rewrite(expr: &IdedExpr) -> IdedExpr {
    Rewrite { in_loop: false }.expr(expr)
}

struct Rewrite {
    in_loop: bool,
}

impl Rewrite {
    fn expr(&mut self, expr: &IdedExpr) -> IdedExpr {
        let rewritten = match &expr.expr {
            Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => expr.expr.clone(),
            Expr::Select(select) => {
                let mut select = select.clone();
                *select.operand = self.expr(&select.operand);
                Expr::Select(select)
            }
            Expr::Call(call) => {
                let sized = self.in_loop && SIZED.contains(&call.func_name.as_str());
                let operand = |this: &mut Self, e: &IdedExpr| {
                    let e = this.expr(e);
                    match sized && reads_data(&e) {
                        true => charged(e, 1),
                        false => e,
                    }
                };
                Expr::Call(CallExpr {
                    func_name: call.func_name.clone(),
                    target: call.target.as_ref().map(|t| Box::new(operand(self, t))),
                    args: call.args.iter().map(|a| operand(self, a)).collect(),
                })
            }
            Expr::List(list) => {
                let mut list = list.clone();
                list.elements = list.elements.iter().map(|e| self.expr(e)).collect();
                Expr::List(list)
            }
            Expr::Map(map) => {
                let mut map = map.clone();
                for entry in &mut map.entries {
                    match &mut entry.expr {
                        EntryExpr::MapEntry(entry) => {
                            entry.key = self.expr(&entry.key);
                            entry.value = self.expr(&entry.value);
                        }
                        EntryExpr::StructField(field) => field.value = self.expr(&field.value),
                    }
                }
                Expr::Map(map)
            }
            Expr::Struct(message) => Expr::Struct(message.clone()),
            Expr::Comprehension(loop_) => {
                let weight = 1 + nodes(&loop_.loop_cond) + nodes(&loop_.loop_step);
                let range = charged(self.expr(&loop_.iter_range), weight);
                let accu_init = self.expr(&loop_.accu_init);
                let outer = std::mem::replace(&mut self.in_loop, true);
                let body = ComprehensionExpr {
                    iter_range: range,
                    accu_init,
                    loop_cond: self.expr(&loop_.loop_cond),
                    loop_step: self.expr(&loop_.loop_step),
                    result: self.expr(&loop_.result),
                    ..(**loop_).clone()
                };
                self.in_loop = outer;
                Expr::Comprehension(Box::new(body))
            }
        };
        IdedExpr {
            id: expr.id,
            expr: rewritten,
        }
    }
}

/// Whether `expr` reads data (a variable, a field, an element) rather than computing a value:
/// only those operands are charged, since what an operation computes from them is charged
/// through them, and charging every operand would deepen the tree by one level per operator.
fn reads_data(expr: &IdedExpr) -> bool {
    match &expr.expr {
        Expr::Ident(_) | Expr::Select(_) => true,
        Expr::Call(call) => call.func_name == operators::INDEX,
        _ => false,
    }
}

/// `@charge(value, weight)`, named by the value's node.
fn charged(value: IdedExpr, weight: u64) -> IdedExpr {
    let id = value.id;
    IdedExpr {
        id,
        expr: Expr::Call(CallExpr {
            func_name: CHARGE.to_owned(),
            target: None,
            args: vec![
                value,
                IdedExpr {
                    id,
                    expr: Expr::Literal(LiteralValue::Int(CelInt::from(
                        i64::try_from(weight).unwrap_or(i64::MAX),
                    ))),
                },
            ],
        }),
    }
}

/// The nodes of `expr`: what evaluating it once visits at most (bounded at load).
fn nodes(expr: &IdedExpr) -> u64 {
    let mut count = 0;
    let mut pending = vec![expr];
    while let Some(expr) = pending.pop() {
        count += 1;
        match &expr.expr {
            Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) | Expr::Struct(_) => {}
            Expr::Select(select) => pending.push(&select.operand),
            Expr::Call(call) => {
                pending.extend(call.target.as_deref());
                pending.extend(&call.args);
            }
            Expr::List(list) => pending.extend(&list.elements),
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(entry) => pending.extend([&entry.key, &entry.value]),
                        EntryExpr::StructField(field) => pending.push(&field.value),
                    }
                }
            }
            Expr::Comprehension(loop_) => pending.extend([
                &loop_.iter_range,
                &loop_.accu_init,
                &loop_.loop_cond,
                &loop_.loop_step,
                &loop_.result,
            ]),
        }
    }
    count
}
