//! An OpenAPI schema as a self-contained JSON Schema for a tool's input: local `$ref`s inlined
//! (bounded in depth and in the size they expand to, refused when recursive), OpenAPI 3.0's
//! `nullable` and boolean `exclusiveMinimum`/`exclusiveMaximum` turned into their JSON Schema
//! forms, and `readOnly` properties (the server's to set) left out.

use serde_json::{Map, Value};

/// How deep `$ref`s may nest.
pub const MAX_REF_DEPTH: usize = 32;
/// How many JSON values one operation's input schema may expand to. A model reads the schema
/// with every call it considers, so one this large is already more than a tool should ask; and
/// a spec whose `$ref`s fan out (each definition naming the next twice, ten deep) is refused,
/// not expanded.
pub const MAX_EXPANDED_NODES: usize = 2_000;

/// Why a schema cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("recursive schema ({0})")]
    Recursive(String),
    #[error("$ref {0:?} is not a local reference this import resolves")]
    ExternalRef(String),
    #[error("$ref {0:?} names nothing in the document")]
    Dangling(String),
    #[error("$refs nest deeper than {MAX_REF_DEPTH}")]
    TooDeep,
    #[error("the schema expands to more than {MAX_EXPANDED_NODES} values")]
    TooLarge,
}

/// Resolves schemas against one OpenAPI document.
pub struct Resolver<'a> {
    document: &'a Value,
    /// OpenAPI 3.0: `nullable` and boolean exclusive bounds are converted.
    v30: bool,
}

impl<'a> Resolver<'a> {
    pub fn new(document: &'a Value, v30: bool) -> Self {
        Resolver { document, v30 }
    }

    /// Follows `value`'s `$ref`, if it has one (for parameters, request bodies and path items).
    pub fn deref(&self, value: &'a Value) -> Result<&'a Value, SchemaError> {
        let mut current = value;
        for _ in 0..MAX_REF_DEPTH {
            match current.get("$ref").and_then(Value::as_str) {
                Some(reference) => current = self.lookup(reference)?,
                None => return Ok(current),
            }
        }
        Err(SchemaError::TooDeep)
    }

    /// `schema` with every local `$ref` inlined and converted for a tool's input.
    pub fn input_schema(&self, schema: &Value) -> Result<Value, SchemaError> {
        let mut budget = MAX_EXPANDED_NODES;
        self.expand(schema, &mut Vec::new(), &mut budget)
    }

    fn lookup(&self, reference: &str) -> Result<&'a Value, SchemaError> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| SchemaError::ExternalRef(reference.to_owned()))?;
        // JSON Pointer escapes, and percent-encoding as URI fragments carry it.
        let decoded = percent_encoding::percent_decode_str(pointer).decode_utf8_lossy();
        self.document
            .pointer(&decoded)
            .ok_or_else(|| SchemaError::Dangling(reference.to_owned()))
    }

    fn expand(
        &self,
        schema: &Value,
        refs: &mut Vec<String>,
        budget: &mut usize,
    ) -> Result<Value, SchemaError> {
        *budget = budget.checked_sub(1).ok_or(SchemaError::TooLarge)?;
        let Value::Object(object) = schema else {
            return match schema {
                Value::Array(items) => items
                    .iter()
                    .map(|item| self.expand(item, refs, budget))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array),
                other => Ok(other.clone()),
            };
        };
        if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
            if refs.iter().any(|seen| seen == reference) {
                refs.push(reference.to_owned());
                let cycle = refs.join(" → ");
                return Err(SchemaError::Recursive(cycle));
            }
            if refs.len() >= MAX_REF_DEPTH {
                return Err(SchemaError::TooDeep);
            }
            let target = self.lookup(reference)?;
            refs.push(reference.to_owned());
            let expanded = self.expand(target, refs, budget);
            refs.pop();
            // Siblings of $ref (3.1 allows them: a description, say) are kept over the target's.
            let mut expanded = expanded?;
            if let Value::Object(merged) = &mut expanded {
                for (key, value) in object.iter().filter(|(k, _)| *k != "$ref") {
                    merged.insert(key.clone(), self.expand(value, refs, budget)?);
                }
            }
            return Ok(expanded);
        }
        let mut out = Map::new();
        for (key, value) in object {
            let value = match key.as_str() {
                // Keywords whose values are names or literals, not schemas.
                "enum" | "const" | "required" | "example" | "examples" | "default" | "type"
                | "format" | "pattern" | "description" | "title" => value.clone(),
                "properties" | "patternProperties" | "$defs" | "definitions" => {
                    let Value::Object(map) = value else {
                        out.insert(key.clone(), value.clone());
                        continue;
                    };
                    let mut expanded = Map::new();
                    for (name, property) in map {
                        if key == "properties"
                            && property.get("readOnly") == Some(&Value::Bool(true))
                        {
                            continue;
                        }
                        expanded.insert(name.clone(), self.expand(property, refs, budget)?);
                    }
                    Value::Object(expanded)
                }
                _ => self.expand(value, refs, budget)?,
            };
            out.insert(key.clone(), value);
        }
        // `required` names no property that was left out as read-only.
        if let (Some(Value::Array(required)), Some(Value::Object(properties))) =
            (object.get("required"), object.get("properties"))
        {
            let kept: Vec<Value> = required
                .iter()
                .filter(|name| {
                    name.as_str().is_some_and(|n| {
                        properties
                            .get(n)
                            .is_none_or(|p| p.get("readOnly") != Some(&Value::Bool(true)))
                    })
                })
                .cloned()
                .collect();
            out.insert("required".into(), Value::Array(kept));
        }
        if self.v30 {
            convert_v30(&mut out);
        }
        Ok(Value::Object(out))
    }
}

/// OpenAPI 3.0's forms in JSON Schema's: `nullable: true` admits null; a boolean
/// `exclusiveMinimum`/`exclusiveMaximum` turns its `minimum`/`maximum` exclusive.
fn convert_v30(schema: &mut Map<String, Value>) {
    if schema.remove("nullable") == Some(Value::Bool(true)) {
        match schema.get_mut("type") {
            Some(Value::String(kind)) => {
                let kind = std::mem::take(kind);
                schema.insert("type".into(), Value::from(vec![kind, "null".into()]));
            }
            Some(Value::Array(kinds)) if !kinds.iter().any(|k| k == "null") => {
                kinds.push("null".into());
            }
            _ => {
                if let Some(Value::Array(values)) = schema.get_mut("enum") {
                    values.push(Value::Null);
                }
            }
        }
    }
    for (flag, bound) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if let Some(Value::Bool(exclusive)) = schema.get(flag).cloned() {
            schema.remove(flag);
            if exclusive && let Some(limit) = schema.remove(bound) {
                schema.insert(flag.into(), limit);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn refs_are_inlined_and_read_only_properties_left_out() {
        let doc = json!({"components": {"schemas": {
            "Invoice": {"type": "object", "properties": {
                "id": {"type": "string", "readOnly": true},
                "customer": {"$ref": "#/components/schemas/Name"}},
                "required": ["id", "customer"]},
            "Name": {"type": "string", "nullable": true}}}});
        let resolved = Resolver::new(&doc, true)
            .input_schema(&json!({"$ref": "#/components/schemas/Invoice"}))
            .unwrap();
        assert_eq!(
            resolved,
            json!({"type": "object", "properties": {"customer": {"type": ["string", "null"]}},
                   "required": ["customer"]})
        );
    }

    #[test]
    fn cycles_and_fan_outs_are_refused() {
        let doc = json!({"components": {"schemas": {
            "Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}}}}});
        let err = Resolver::new(&doc, false)
            .input_schema(&json!({"$ref": "#/components/schemas/Node"}))
            .unwrap_err();
        assert!(matches!(err, SchemaError::Recursive(_)), "{err}");

        // Each level names the next twice: 2^30 values if expanded.
        let mut schemas = Map::new();
        for i in 0..30 {
            let next = json!({"$ref": format!("#/components/schemas/L{}", i + 1)});
            schemas.insert(
                format!("L{i}"),
                json!({"type": "object", "properties": {"a": next, "b": next}}),
            );
        }
        schemas.insert("L30".into(), json!({"type": "string"}));
        let doc = json!({"components": {"schemas": schemas}});
        let err = Resolver::new(&doc, false)
            .input_schema(&json!({"$ref": "#/components/schemas/L0"}))
            .unwrap_err();
        assert_eq!(err, SchemaError::TooLarge);
    }

    #[test]
    fn openapi_3_0_bounds_become_json_schema_ones() {
        let doc = json!({});
        let resolved = Resolver::new(&doc, true)
            .input_schema(&json!({"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 9, "exclusiveMaximum": false}))
            .unwrap();
        assert_eq!(
            resolved,
            json!({"type": "integer", "exclusiveMinimum": 0, "maximum": 9})
        );
    }
}
