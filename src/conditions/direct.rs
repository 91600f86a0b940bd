//! Conditions decided in place: the common shapes of expression — comparisons, `in`, the string
//! tests, `matches` with a literal pattern, `size`, `has`, `!`, `&&`, `||`, `?:`, int arithmetic
//! and the `all`, `exists` and `exists_one` macros, over literals and the fields of `caller`,
//! `tool`, `args` and `run` — are evaluated here by reading the caller, the tool and the
//! arguments where they are, without the interpreter: nothing is converted to the interpreter's
//! values and nothing is allocated. That is what makes a rule on the caller free per call.
//!
//! This is a fast path, never a second meaning: it answers only when the answer cannot differ
//! from the interpreter's — same-typed comparisons of strings, ints and bools, and the
//! operators' own short-circuits — and hands everything else back (`None`): a missing field, a
//! type mismatch, a number that is not an `int`, an overflow, `now`, `map` and `filter`,
//! conversions. The interpreter then decides, and reports the error exactly as it always did.
//! The unit tests and the `conditions` fuzz target compare the two on every expression they
//! make.

use std::collections::BTreeSet;

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, LiteralValue, operators};
use serde_json::{Map, Value as Json};

use super::{CallFacts, Input, ToolFacts, meter::Meter};
use crate::identity::Caller;

/// An expression in the shapes decided in place, built at load.
#[derive(Debug)]
pub(super) struct Direct(Node);

#[derive(Debug)]
enum Node {
    Bool(bool),
    Int(i64),
    Text(Box<str>),
    /// `caller`, `tool`, `args` or `run`.
    Variable(Root),
    /// A loop variable or accumulator, by slot.
    Local(usize),
    /// A comprehension: for each element of `range` (a list's elements, an object's keys) in
    /// slot `item`, with the accumulator in `item + 1` starting at `init`: while `parts[0]`
    /// holds, the accumulator becomes `parts[1]`; the value is `parts[2]`.
    Loop {
        range: Box<Node>,
        init: Box<Node>,
        item: usize,
        parts: Box<[Node; 3]>,
    },
    /// `@not_strictly_false(x)`, the macros' loop condition.
    NotStrictlyFalse(Box<Node>),
    Arithmetic(Arithmetic, Box<Node>, Box<Node>),
    /// `text.matches('literal')`, compiled at load.
    Matches(Box<Node>, Box<regex::Regex>),
    /// `operand.field`, or with `test`, `has(operand.field)`.
    Select {
        operand: Box<Node>,
        field: Box<str>,
        test: bool,
    },
    /// `operand[key]`.
    Index(Box<Node>, Box<Node>),
    /// A list literal: only as the right-hand side of `in`.
    List(Vec<Node>),
    Not(Box<Node>),
    Negate(Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Choose(Box<[Node; 3]>),
    Compare(Comparison, Box<Node>, Box<Node>),
    In(Box<Node>, Box<Node>),
    StringTest(StringTest, Box<Node>, Box<Node>),
    Size(Box<Node>),
    /// `@charge(operand, weight)` ([`super::meter`]): the operand, its size times `weight`
    /// charged to the evaluation's budget.
    Charge(Box<Node>, u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Root {
    Caller,
    Tool,
    Args,
    Run,
}

#[derive(Debug, Clone, Copy)]
enum Comparison {
    Equal,
    NotEqual,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

#[derive(Debug, Clone, Copy)]
enum Arithmetic {
    Add,
    Subtract,
    Multiply,
    Divide,
    Modulo,
}

/// Loop variables and accumulators in scope at once: two nested comprehensions
/// ([`super::MAX_NESTED_LOOPS`]) of two each.
const MAX_LOCALS: usize = 2 * super::MAX_NESTED_LOOPS;

#[derive(Debug, Clone, Copy)]
enum StringTest {
    StartsWith,
    EndsWith,
    Contains,
}

/// A value read in place.
#[derive(Clone, Copy)]
enum Value<'a> {
    Bool(bool),
    Int(i64),
    Text(&'a str),
    Caller(&'a Caller),
    Tool(ToolFacts<'a>),
    Run(&'a str),
    Scopes(&'a BTreeSet<String>),
    /// A JSON object (the arguments, an object in them, the claims); `None`: no claims.
    Object(Option<&'a Map<String, Json>>),
    Array(&'a [Json]),
}

impl Direct {
    /// The expression in the shapes decided in place, or `None` when any part of it is not.
    pub(super) fn plan(expr: &IdedExpr) -> Option<Direct> {
        Planner::default().node(expr).map(Direct)
    }

    /// The rule's (or approval's) value, when it is decided in place; or that the evaluation
    /// ran out of its budget.
    pub(super) fn holds(&self, input: &Input<'_>) -> Result<Option<bool>, Exhausted> {
        self.value(input, |value| match value {
            Value::Bool(holds) => Some(holds),
            _ => None,
        })
    }

    /// The quota cost, when it is decided in place and is a whole number of cells; or that the
    /// evaluation ran out of its budget.
    pub(super) fn cost(&self, input: &Input<'_>) -> Result<Option<u64>, Exhausted> {
        self.value(input, |value| match value {
            Value::Int(cells) => u64::try_from(cells).ok(),
            _ => None,
        })
    }

    /// The expression's value, when it is decided in place. An evaluation out of budget is not
    /// handed to the interpreter: both charge the same tree in the same order (this one only
    /// where it mirrors the interpreter's short-circuits; an error, which the interpreter may
    /// evaluate further to absorb, hands over before), so the interpreter would run out too,
    /// after doing all of it again ten times slower.
    fn value<T>(
        &self,
        input: &Input<'_>,
        answer: impl FnOnce(Value<'_>) -> Option<T>,
    ) -> Result<Option<T>, Exhausted> {
        let meter = Meter::new();
        let value = eval(&self.0, &Facts::of(input, &meter));
        match meter.exhausted() {
            true => Err(Exhausted),
            false => Ok(value.and_then(answer)),
        }
    }
}

/// An in-place evaluation ran out of its budget ([`super::meter`]).
#[derive(Debug)]
pub(super) struct Exhausted;

/// What an evaluation reads: the call, and the loop variables in scope.
#[derive(Clone, Copy)]
struct Facts<'a, 'm> {
    caller: &'a Caller,
    tool: ToolFacts<'a>,
    call: Option<CallFacts<'a>>,
    locals: [Option<Value<'a>>; MAX_LOCALS],
    /// The evaluation's budget.
    meter: &'m Meter,
}

impl<'a, 'm> Facts<'a, 'm> {
    fn of(input: &Input<'a>, meter: &'m Meter) -> Self {
        Facts {
            caller: input.caller,
            tool: input.tool,
            call: input.call,
            locals: [None; MAX_LOCALS],
            meter,
        }
    }
}

/// Builds the in-place form at load, knowing which loop variables are in scope.
#[derive(Default)]
struct Planner {
    /// Loop variables in scope, innermost last: a variable's slot is its index here.
    scope: Vec<String>,
}

impl Planner {
    fn boxed(&mut self, expr: &IdedExpr) -> Option<Box<Node>> {
        self.node(expr).map(Box::new)
    }

    fn node(&mut self, expr: &IdedExpr) -> Option<Node> {
        Some(match &expr.expr {
            Expr::Literal(LiteralValue::Boolean(b)) => Node::Bool(*b.inner()),
            Expr::Literal(LiteralValue::Int(i)) => Node::Int(*i.inner()),
            Expr::Literal(LiteralValue::String(s)) => Node::Text(s.inner().into()),
            Expr::Ident(name) => {
                // A loop variable: the innermost of that name.
                if let Some(slot) = self.scope.iter().rposition(|bound| bound == name) {
                    return Some(Node::Local(slot));
                }
                Node::Variable(match name.as_str() {
                    "caller" => Root::Caller,
                    "tool" => Root::Tool,
                    "args" => Root::Args,
                    "run" => Root::Run,
                    // `now` and type names are the interpreter's.
                    _ => return None,
                })
            }
            Expr::Select(select) => Node::Select {
                operand: self.boxed(&select.operand)?,
                field: select.field.as_str().into(),
                test: select.test,
            },
            Expr::List(list) if list.optional_indices.is_empty() => Node::List(
                list.elements
                    .iter()
                    .map(|e| self.node(e))
                    .collect::<Option<_>>()?,
            ),
            Expr::Comprehension(loop_) => self.comprehension(loop_)?,
            Expr::Call(call) => self.call(&call.func_name, call.target.as_deref(), &call.args)?,
            _ => return None,
        })
    }

    fn call(&mut self, name: &str, target: Option<&IdedExpr>, args: &[IdedExpr]) -> Option<Node> {
        Some(match (target, args) {
            (None, [a]) => match name {
                operators::LOGICAL_NOT => Node::Not(self.boxed(a)?),
                operators::NOT_STRICTLY_FALSE => Node::NotStrictlyFalse(self.boxed(a)?),
                operators::NEGATE => Node::Negate(self.boxed(a)?),
                "size" => Node::Size(self.boxed(a)?),
                _ => return None,
            },
            (None, [operand, weight]) if name == super::meter::CHARGE => {
                let Expr::Literal(LiteralValue::Int(weight)) = &weight.expr else {
                    return None;
                };
                Node::Charge(self.boxed(operand)?, u64::try_from(*weight.inner()).ok()?)
            }
            (None, [a, b]) => {
                let (a, b) = (self.boxed(a)?, self.boxed(b)?);
                let comparison = match name {
                    operators::LOGICAL_AND => return Some(Node::And(a, b)),
                    operators::LOGICAL_OR => return Some(Node::Or(a, b)),
                    operators::IN => return Some(Node::In(a, b)),
                    operators::INDEX => return Some(Node::Index(a, b)),
                    operators::ADD => return Some(Node::Arithmetic(Arithmetic::Add, a, b)),
                    operators::SUBSTRACT => {
                        return Some(Node::Arithmetic(Arithmetic::Subtract, a, b));
                    }
                    operators::MULTIPLY => {
                        return Some(Node::Arithmetic(Arithmetic::Multiply, a, b));
                    }
                    operators::DIVIDE => return Some(Node::Arithmetic(Arithmetic::Divide, a, b)),
                    operators::MODULO => return Some(Node::Arithmetic(Arithmetic::Modulo, a, b)),
                    operators::EQUALS => Comparison::Equal,
                    operators::NOT_EQUALS => Comparison::NotEqual,
                    operators::LESS => Comparison::Less,
                    operators::LESS_EQUALS => Comparison::LessOrEqual,
                    operators::GREATER => Comparison::Greater,
                    operators::GREATER_EQUALS => Comparison::GreaterOrEqual,
                    _ => return None,
                };
                Node::Compare(comparison, a, b)
            }
            (None, [c, a, b]) if name == operators::CONDITIONAL => {
                Node::Choose(Box::new([self.node(c)?, self.node(a)?, self.node(b)?]))
            }
            (Some(target), []) if name == "size" => Node::Size(self.boxed(target)?),
            (Some(target), [pattern]) if name == "matches" => {
                // Only a literal pattern, compiled here once as the interpreter would compile
                // it on every evaluation; one that does not compile is the interpreter's error.
                let Expr::Literal(LiteralValue::String(pattern)) = &pattern.expr else {
                    return None;
                };
                let regex = regex::Regex::new(pattern.inner()).ok()?;
                Node::Matches(self.boxed(target)?, Box::new(regex))
            }
            (Some(target), [needle]) => {
                let test = match name {
                    "startsWith" => StringTest::StartsWith,
                    "endsWith" => StringTest::EndsWith,
                    "contains" => StringTest::Contains,
                    _ => return None,
                };
                Node::StringTest(test, self.boxed(target)?, self.boxed(needle)?)
            }
            _ => return None,
        })
    }

    /// A comprehension (the `all`, `exists` and `exists_one` macros): its loop variable and
    /// accumulator take the next slots for the loop's parts.
    fn comprehension(&mut self, loop_: &ComprehensionExpr) -> Option<Node> {
        if loop_.iter_var2.is_some() || self.scope.len() + 2 > MAX_LOCALS {
            return None;
        }
        let range = self.boxed(&loop_.iter_range)?;
        let init = self.boxed(&loop_.accu_init)?;
        let scope = self.scope.len();
        self.scope.push(loop_.iter_var.clone());
        self.scope.push(loop_.accu_var.clone());
        let parts = (|| {
            Some(Box::new([
                self.node(&loop_.loop_cond)?,
                self.node(&loop_.loop_step)?,
                self.node(&loop_.result)?,
            ]))
        })();
        self.scope.truncate(scope);
        Some(Node::Loop {
            range,
            init,
            item: scope,
            parts: parts?,
        })
    }
}

/// The value of `node`, or `None` when the interpreter must decide.
fn eval<'a>(node: &'a Node, facts: &Facts<'a, '_>) -> Option<Value<'a>> {
    Some(match node {
        Node::Bool(b) => Value::Bool(*b),
        Node::Int(i) => Value::Int(*i),
        Node::Text(text) => Value::Text(text),
        Node::Variable(root) => match root {
            Root::Caller => Value::Caller(facts.caller),
            Root::Tool => Value::Tool(facts.tool),
            Root::Args => json(facts.call?.args)?,
            Root::Run => Value::Run(facts.call?.run_id),
        },
        Node::Select {
            operand,
            field,
            test,
        } => {
            let operand = eval(operand, facts)?;
            if *test {
                // `has` on an object: whether the key is there.
                let Value::Object(map) = operand else {
                    return None;
                };
                return Some(Value::Bool(
                    map.is_some_and(|map| map.contains_key(&**field)),
                ));
            }
            field_of(operand, field)?
        }
        Node::Index(operand, key) => match (eval(operand, facts)?, eval(key, facts)?) {
            (Value::Object(map), Value::Text(key)) => json(map?.get(key)?)?,
            (Value::Array(items), Value::Int(at)) => json(items.get(usize::try_from(at).ok()?)?)?,
            _ => return None,
        },
        Node::Local(slot) => facts.locals[*slot]?,
        Node::Loop {
            range,
            init,
            item,
            parts,
        } => {
            let [condition, step, result] = &**parts;
            let mut inner = *facts;
            inner.locals[item + 1] = Some(eval(init, facts)?);
            let mut each = |element: Value<'a>| -> Option<bool> {
                inner.locals[*item] = Some(element);
                if !boolean(condition, &inner)? {
                    return Some(false);
                }
                inner.locals[item + 1] = Some(eval(step, &inner)?);
                Some(true)
            };
            match eval(range, facts)? {
                Value::Scopes(scopes) => {
                    for scope in scopes {
                        if !each(Value::Text(scope))? {
                            break;
                        }
                    }
                }
                Value::Array(items) => {
                    for element in items {
                        if !each(json(element)?)? {
                            break;
                        }
                    }
                }
                Value::Object(map) => {
                    for key in map.into_iter().flat_map(Map::keys) {
                        if !each(Value::Text(key))? {
                            break;
                        }
                    }
                }
                _ => return None,
            }
            eval(result, &inner)?
        }
        Node::NotStrictlyFalse(operand) => Value::Bool(boolean(operand, facts)?),
        Node::Arithmetic(operation, a, b) => {
            let (Value::Int(a), Value::Int(b)) = (eval(a, facts)?, eval(b, facts)?) else {
                return None;
            };
            // Overflow and division by zero are the interpreter's errors.
            Value::Int(match operation {
                Arithmetic::Add => a.checked_add(b)?,
                Arithmetic::Subtract => a.checked_sub(b)?,
                Arithmetic::Multiply => a.checked_mul(b)?,
                Arithmetic::Divide => a.checked_div(b)?,
                Arithmetic::Modulo => a.checked_rem(b)?,
            })
        }
        Node::Matches(target, regex) => match eval(target, facts)? {
            Value::Text(text) => Value::Bool(regex.is_match(text)),
            _ => return None,
        },
        Node::List(_) => return None,
        Node::Not(operand) => Value::Bool(!boolean(operand, facts)?),
        Node::Negate(operand) => match eval(operand, facts)? {
            Value::Int(i) => Value::Int(i.checked_neg()?),
            _ => return None,
        },
        // The interpreter's short-circuits: `false && x` is false and `true || x` true whatever
        // `x` is. Any other case with a side it cannot read is the interpreter's.
        Node::And(a, b) => Value::Bool(boolean(a, facts)? && boolean(b, facts)?),
        Node::Or(a, b) => Value::Bool(boolean(a, facts)? || boolean(b, facts)?),
        Node::Choose(parts) => {
            let [condition, then, otherwise] = &**parts;
            eval(
                if boolean(condition, facts)? {
                    then
                } else {
                    otherwise
                },
                facts,
            )?
        }
        Node::Compare(comparison, a, b) => {
            let ordering = match (eval(a, facts)?, eval(b, facts)?) {
                (Value::Int(a), Value::Int(b)) => a.cmp(&b),
                // Rust orders strings by bytes, which in UTF-8 is CEL's order by code point.
                (Value::Text(a), Value::Text(b)) => a.cmp(b),
                (Value::Bool(a), Value::Bool(b)) => match comparison {
                    Comparison::Equal => return Some(Value::Bool(a == b)),
                    Comparison::NotEqual => return Some(Value::Bool(a != b)),
                    _ => return None,
                },
                _ => return None,
            };
            Value::Bool(match comparison {
                Comparison::Equal => ordering.is_eq(),
                Comparison::NotEqual => ordering.is_ne(),
                Comparison::Less => ordering.is_lt(),
                Comparison::LessOrEqual => ordering.is_le(),
                Comparison::Greater => ordering.is_gt(),
                Comparison::GreaterOrEqual => ordering.is_ge(),
            })
        }
        Node::In(needle, haystack) => Value::Bool(contains(needle, haystack, facts)?),
        Node::StringTest(test, target, needle) => {
            let (Value::Text(target), Value::Text(needle)) =
                (eval(target, facts)?, eval(needle, facts)?)
            else {
                return None;
            };
            Value::Bool(match test {
                StringTest::StartsWith => target.starts_with(needle),
                StringTest::EndsWith => target.ends_with(needle),
                StringTest::Contains => target.contains(needle),
            })
        }
        Node::Size(operand) => {
            let size = match eval(operand, facts)? {
                // CEL counts a string's code points.
                Value::Text(text) => text.chars().count(),
                Value::Scopes(scopes) => scopes.len(),
                Value::Array(items) => items.len(),
                Value::Object(map) => map.map_or(0, Map::len),
                _ => return None,
            };
            Value::Int(i64::try_from(size).ok()?)
        }
        Node::Charge(operand, weight) => {
            let value = eval(operand, facts)?;
            let size = match value {
                Value::Text(text) => super::meter::steps_of_text(text),
                Value::Scopes(scopes) => super::meter::steps(scopes.len()),
                Value::Array(items) => super::meter::steps(items.len()),
                Value::Object(map) => super::meter::steps(map.map_or(0, Map::len)),
                _ => super::meter::steps(1),
            };
            // Out of budget: the evaluation stops (`Direct::value` says so).
            if !facts.meter.charge(weight.saturating_mul(size)) {
                return None;
            }
            value
        }
    })
}

fn boolean(node: &Node, facts: &Facts<'_, '_>) -> Option<bool> {
    match eval(node, facts)? {
        Value::Bool(b) => Some(b),
        _ => None,
    }
}

/// `needle in haystack`: a scope among the caller's, a key of an object, or an element of a
/// list whose elements are all of the needle's type.
fn contains(needle: &Node, haystack: &Node, facts: &Facts<'_, '_>) -> Option<bool> {
    let needle = eval(needle, facts)?;
    if let Node::List(elements) = haystack {
        let mut found = false;
        for element in elements {
            found |= same_scalar(needle, eval(element, facts)?)?;
        }
        return Some(found);
    }
    match (needle, eval(haystack, facts)?) {
        (Value::Text(scope), Value::Scopes(scopes)) => Some(scopes.contains(scope)),
        (Value::Text(key), Value::Object(map)) => {
            Some(map.is_some_and(|map| map.contains_key(key)))
        }
        (needle, Value::Array(items)) => {
            let mut found = false;
            for item in items {
                found |= same_scalar(needle, json(item)?)?;
            }
            Some(found)
        }
        _ => None,
    }
}

/// Whether two scalars of the same type are equal; `None` for any other pair (CEL's equality
/// across types, e.g. `1 == 1.0`, is the interpreter's).
fn same_scalar(a: Value<'_>, b: Value<'_>) -> Option<bool> {
    match (a, b) {
        (Value::Text(a), Value::Text(b)) => Some(a == b),
        (Value::Int(a), Value::Int(b)) => Some(a == b),
        (Value::Bool(a), Value::Bool(b)) => Some(a == b),
        _ => None,
    }
}

/// `operand.field` for the fields conditions see.
fn field_of<'a>(operand: Value<'a>, field: &str) -> Option<Value<'a>> {
    Some(match (operand, field) {
        (Value::Caller(caller), "tenant") => Value::Text(&caller.tenant),
        (Value::Caller(caller), "subject") => Value::Text(&caller.subject),
        (Value::Caller(caller), "agent") => Value::Text(&caller.agent),
        (Value::Caller(caller), "scopes") => Value::Scopes(&caller.scopes),
        (Value::Caller(caller), "claims") => Value::Object(caller.claims.map()),
        (Value::Tool(tool), "name") => Value::Text(tool.name),
        (Value::Tool(tool), "version") => Value::Text(tool.version),
        (Value::Tool(tool), "risk_level") => Value::Text(tool.risk_level),
        (Value::Run(id), "id") => Value::Text(id),
        (Value::Object(map), field) => json(map?.get(field)?)?,
        _ => return None,
    })
}

/// A JSON value as conditions read it: whole numbers in the `int` range are ints, as the
/// interpreter's conversion makes them; other numbers and `null` are the interpreter's.
fn json(value: &Json) -> Option<Value<'_>> {
    Some(match value {
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => Value::Int(n.as_i64()?),
        Json::String(s) => Value::Text(s),
        Json::Array(items) => Value::Array(items),
        Json::Object(map) => Value::Object(Some(map)),
        Json::Null => return None,
    })
}
