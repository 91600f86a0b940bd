//! JSON Schema work done once at load: compiling, reading the `bind` table, and removing bound
//! properties from the schema the model sees.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::settings::FieldError;

/// Where a bound value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum BindValue {
    CallerTenant,
    CallerSubject,
    CallerAgent,
    Constant(Value),
}

/// A server-bound argument: a path into the arguments and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// Property names from the argument object's root, e.g. `["filter", "tenant"]`.
    pub path: Vec<String>,
    /// The dotted form, as written in the catalog.
    pub dotted: String,
    pub value: BindValue,
}

/// Compiles a schema; remote `$ref`s cannot resolve (no network resolver is built in).
pub fn compile(schema: &Value, path: &str) -> Result<jsonschema::Validator, FieldError> {
    jsonschema::validator_for(schema)
        .map_err(|err| FieldError::new(path, format!("invalid JSON Schema: {err}")))
}

/// Reads the `bind` table; every path must name a property the schema declares.
pub fn parse_bindings(
    bind: &BTreeMap<String, Value>,
    schema: &Value,
    path: &str,
) -> Result<Vec<Binding>, FieldError> {
    bind.iter()
        .map(|(dotted, value)| {
            let at = format!("{path}.{dotted}");
            let segments: Vec<String> = dotted.split('.').map(str::to_owned).collect();
            if segments.iter().any(String::is_empty) {
                return Err(FieldError::new(at, "invalid argument path"));
            }
            if !declares(schema, &segments) {
                return Err(FieldError::new(
                    at,
                    format!("the input schema declares no property {dotted:?}"),
                ));
            }
            let value = match value.as_str() {
                Some("${caller.tenant}") => BindValue::CallerTenant,
                Some("${caller.subject}") => BindValue::CallerSubject,
                Some("${caller.agent}") => BindValue::CallerAgent,
                Some(other) if other.contains("${") => {
                    return Err(FieldError::new(
                        at,
                        format!(
                            "unknown placeholder in {other:?}; use ${{caller.tenant}}, ${{caller.subject}} or ${{caller.agent}}"
                        ),
                    ));
                }
                _ => BindValue::Constant(value.clone()),
            };
            Ok(Binding {
                path: segments,
                dotted: dotted.clone(),
                value,
            })
        })
        .collect()
}

fn declares(schema: &Value, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true;
    };
    schema
        .get("properties")
        .and_then(|p| p.get(first))
        .is_some_and(|child| declares(child, rest))
}

/// The schema without bound properties; an object left with no properties by that is removed too,
/// so the model never sees an empty `filter: {}` it cannot fill.
pub fn strip_bound(schema: &Value, bindings: &[Binding]) -> Value {
    let mut visible = schema.clone();
    for binding in bindings {
        remove_property(&mut visible, &binding.path);
    }
    visible
}

/// What removing a bound property left of the schema at one level.
struct Left {
    /// No properties remain: the object itself can go.
    empty: bool,
    /// Nothing required remains: binding alone satisfies it, so the model need not send it.
    nothing_required: bool,
}

fn remove_property(schema: &mut Value, path: &[String]) -> Left {
    let untouched = Left {
        empty: false,
        nothing_required: false,
    };
    let Some((first, rest)) = path.split_first() else {
        return untouched;
    };
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return untouched;
    };
    let (remove, unrequire) = match props.get_mut(first) {
        Some(child) if !rest.is_empty() => {
            let left = remove_property(child, rest);
            (left.empty, left.empty || left.nothing_required)
        }
        Some(_) => (true, true),
        None => (false, false),
    };
    if remove {
        props.shift_remove(first);
    }
    if unrequire && let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| r.as_str() != Some(first));
    }
    Left {
        empty: schema
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| p.is_empty()),
        nothing_required: schema
            .get("required")
            .and_then(Value::as_array)
            .is_none_or(|r| r.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stripping_removes_bound_leaf_and_emptied_parents() {
        let schema = json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filter": {"type": "object", "properties": {"tenant": {"type": "string"}}, "required": ["tenant"]}
            },
            "required": ["query", "filter"]
        });
        let bind = BTreeMap::from([("filter.tenant".to_owned(), json!("${caller.tenant}"))]);
        let bindings = parse_bindings(&bind, &schema, "tools[0].bind").unwrap();
        assert_eq!(bindings[0].value, BindValue::CallerTenant);
        let visible = strip_bound(&schema, &bindings);
        assert_eq!(
            visible,
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]})
        );
    }

    #[test]
    fn binding_an_undeclared_property_is_an_error_naming_it() {
        let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let bind = BTreeMap::from([("filter.tenant".to_owned(), json!("${caller.tenant}"))]);
        let err = parse_bindings(&bind, &schema, "tools[3].bind").unwrap_err();
        assert_eq!(err.path, "tools[3].bind.filter.tenant");
    }
}
