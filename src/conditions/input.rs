//! What a condition is evaluated on: the variables an expression reads, made once per input in
//! the interpreter's own form and lent to it, and the trace explanations show.

use std::{
    cell::{OnceCell, RefCell},
    collections::HashMap,
    time::SystemTime,
};

use cel::{
    common::{
        types::{
            CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString,
            CelTimestamp, CelUInt,
        },
        value::{CowVal, Val},
    },
    context::VariableResolver,
};

use super::{Condition, Evaluation, VARIABLES};
use crate::identity::Caller;

/// What a condition is evaluated on. The variables' values are made when a condition first
/// reads them and shared by every condition evaluated on the same input (a call's rules).
pub struct Input<'a> {
    pub(super) caller: &'a Caller,
    pub(super) tool: ToolFacts<'a>,
    pub(super) call: Option<CallFacts<'a>>,
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
    pub(super) fn value(&self, index: usize) -> Option<&Result<Box<dyn Val + 'a>, String>> {
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
pub(super) struct Bound<'i, 'a>(pub(super) [Option<&'i (dyn Val + 'a)>; 5]);

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
