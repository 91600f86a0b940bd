//! Tools from an OpenAPI description (docs/openapi.md): each chosen operation becomes a catalog
//! entry — name, description, one input schema merging its path, query and header parameters and
//! its JSON request body, the request mapping that sends them back where they came from, and a
//! risk level from its method — for a person to review and commit. The catalog stays the source
//! of truth: nothing here runs at serve time. Operations that cannot be mapped are listed with the
//! reason, never dropped silently. Reading is bounded: the document's size, its `$ref` depth and
//! expansion ([`schema`]), and the number of operations.

pub mod schema;

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use schema::{Resolver, SchemaError};

/// The largest description read, in bytes.
pub const MAX_SPEC_BYTES: usize = 64 * 1024 * 1024;
/// The most operations one document may hold.
pub const MAX_OPERATIONS: usize = 20_000;
/// A tool description's longest text, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head"];

/// Why a document cannot be imported at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the description is {0} bytes; the limit is {MAX_SPEC_BYTES}")]
    TooLarge(usize),
    #[error("the description is not JSON or YAML: {0}")]
    Unreadable(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("the description holds {0} operations; the limit is {MAX_OPERATIONS}")]
    TooManyOperations(usize),
}

/// Which operations to import; empty lists take every operation.
#[derive(Debug, Default)]
pub struct Selection {
    pub operations: Vec<String>,
    pub tags: Vec<String>,
    pub path_prefix: Option<String>,
    /// The description's path as entries name it (`openapi.spec`); `None` writes no source.
    pub spec_name: Option<String>,
}

/// `sha256:` and the SHA-256 of an imported entry's canonical JSON, its name, upstream and
/// source aside: what the operation means as a tool, however the entry was renamed.
pub fn digest(entry: &Value) -> String {
    let mut meaning = entry.clone();
    if let Some(object) = meaning.as_object_mut() {
        object.remove("name");
        object.remove("openapi");
    }
    if let Some(http) = meaning
        .pointer_mut("/executor/http")
        .and_then(Value::as_object_mut)
    {
        http.remove("upstream");
    }
    format!("sha256:{}", crate::canonical::sha256_hex(&meaning))
}

/// What the operation `key` (an operationId, or `METHOD /path`) of `document` imports as now,
/// as its [`digest`]; why not, when it cannot be found or mapped.
pub fn operation_digest(document: &Value, key: &str) -> Result<String, String> {
    let mut selection = Selection::default();
    let by_route = key
        .split_once(' ')
        .filter(|(m, p)| METHODS.contains(&m.to_ascii_lowercase().as_str()) && p.starts_with('/'));
    if by_route.is_none() {
        selection.operations = vec![key.to_owned()];
    }
    let imported = import(document, "u", &selection).map_err(|err| err.to_string())?;
    let found = imported.tools.iter().find(|tool| match by_route {
        Some((method, path)) => {
            tool.pointer("/executor/http/method")
                .and_then(Value::as_str)
                == Some(&method.to_ascii_uppercase())
                && tool.pointer("/executor/http/path").and_then(Value::as_str) == Some(path)
        }
        None => true,
    });
    match found {
        Some(tool) => Ok(digest(tool)),
        None => Err(imported
            .skipped
            .iter()
            .find(|(label, _)| label.contains(key))
            .map(|(_, why)| format!("it can no longer be imported: {why}"))
            .unwrap_or_else(|| "the description no longer has it".into())),
    }
}

/// What an import made.
#[derive(Debug, Default)]
pub struct Imported {
    /// The catalog entries, in the document's order.
    pub tools: Vec<Value>,
    /// `METHOD /path` (and the operation id) of each operation left out, with why.
    pub skipped: Vec<(String, String)>,
    /// The document's title and version, for the header.
    pub title: String,
    /// How many entries were made.
    pub count: usize,
}

/// Parses a description (JSON or YAML, by its first character) within the bounds.
pub fn parse(text: &str) -> Result<Value, ImportError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(ImportError::TooLarge(text.len()));
    }
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).map_err(|err| ImportError::Unreadable(err.to_string()));
    }
    // Aliases and nesting bounded before parsing: a YAML "billion laughs" is refused here.
    crate::settings::yaml_bounds::check(text)
        .map_err(|err| ImportError::Unreadable(err.to_string()))?;
    serde_yaml_ng::from_str(text).map_err(|err| ImportError::Unreadable(err.to_string()))
}

/// The chosen operations of `document` as catalog entries on `upstream`.
pub fn import(
    document: &Value,
    upstream: &str,
    selection: &Selection,
) -> Result<Imported, ImportError> {
    let mut tools = Vec::new();
    let mut imported = import_each(document, upstream, selection, &mut |tool| tools.push(tool))?;
    imported.tools = tools;
    Ok(imported)
}

/// As [`import`], handing each entry to `each` as it is made instead of keeping it (the
/// returned [`Imported`] has no tools): a description of ten thousand operations is never held
/// as ten thousand entries at once.
pub fn import_each(
    document: &Value,
    upstream: &str,
    selection: &Selection,
    each: &mut dyn FnMut(Value),
) -> Result<Imported, ImportError> {
    let version = document
        .get("openapi")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ImportError::Unsupported(
                "not an OpenAPI 3 description (no `openapi` version; Swagger 2.0 is not read)"
                    .into(),
            )
        })?;
    let v30 = version.starts_with("3.0");
    if !v30 && !version.starts_with("3.1") {
        return Err(ImportError::Unsupported(format!(
            "OpenAPI {version} is not read (3.0 and 3.1 are)"
        )));
    }
    let resolver = Resolver::new(document, v30);
    let paths = document
        .get("paths")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let count: usize = paths
        .values()
        .map(|item| METHODS.iter().filter(|m| item.get(**m).is_some()).count())
        .sum();
    if count > MAX_OPERATIONS {
        return Err(ImportError::TooManyOperations(count));
    }
    let info = document.get("info");
    let mut imported = Imported {
        title: format!(
            "{} {}",
            info.and_then(|i| i.get("title"))
                .and_then(Value::as_str)
                .unwrap_or("(untitled)"),
            info.and_then(|i| i.get("version"))
                .and_then(Value::as_str)
                .unwrap_or("")
        )
        .trim()
        .to_owned(),
        ..Imported::default()
    };
    let mut names = BTreeSet::new();
    for (path, item) in &paths {
        if let Some(prefix) = &selection.path_prefix
            && !path.starts_with(prefix.as_str())
        {
            continue;
        }
        let item = match resolver.deref(item) {
            Ok(item) => item,
            Err(err) => {
                imported.skipped.push((path.clone(), err.to_string()));
                continue;
            }
        };
        for method in METHODS {
            let Some(operation) = item.get(*method) else {
                continue;
            };
            let id = operation.get("operationId").and_then(Value::as_str);
            if !selection.operations.is_empty()
                && !id.is_some_and(|id| selection.operations.iter().any(|o| o == id))
            {
                continue;
            }
            if !selection.tags.is_empty() {
                let tags: Vec<&str> = operation
                    .get("tags")
                    .and_then(Value::as_array)
                    .map(|t| t.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if !selection.tags.iter().any(|t| tags.contains(&t.as_str())) {
                    continue;
                }
            }
            let label = format!(
                "{} {path}{}",
                method.to_uppercase(),
                id.map(|id| format!(" ({id})")).unwrap_or_default()
            );
            let name = unique_name(
                &mut names,
                id.map(str::to_owned)
                    .unwrap_or_else(|| format!("{method}_{path}")),
            );
            match tool(&resolver, upstream, path, method, item, operation, &name) {
                Ok(mut tool) => {
                    let key = id
                        .map(str::to_owned)
                        .unwrap_or_else(|| format!("{} {path}", method.to_uppercase()));
                    let digest = digest(&tool);
                    if let Some(spec) = &selection.spec_name {
                        tool["openapi"] = json!({"spec": spec, "operation": key, "sha256": digest});
                    }
                    imported.count += 1;
                    each(tool)
                }
                Err(why) => {
                    names.remove(&name);
                    imported.skipped.push((label, why));
                }
            }
        }
    }
    Ok(imported)
}

/// A valid tool name (1-64 of `A-Z a-z 0-9 _ - .`) not taken yet.
fn unique_name(taken: &mut BTreeSet<String>, wanted: String) -> String {
    let mut base: String = wanted
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    base = base.trim_matches('_').to_owned();
    if base.is_empty() {
        base = "operation".into();
    }
    base.truncate(60);
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        name = format!("{base}_{n}");
        n += 1;
    }
    name
}

/// One operation as a catalog entry, or why it cannot be one.
fn tool(
    resolver: &Resolver<'_>,
    upstream: &str,
    path: &str,
    method: &str,
    item: &Value,
    operation: &Value,
    name: &str,
) -> Result<Value, String> {
    let why = |err: SchemaError| err.to_string();
    // Path-level parameters, overridden by the operation's of the same name and place.
    let mut parameters: Vec<&Value> = Vec::new();
    for list in [item.get("parameters"), operation.get("parameters")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
    {
        for parameter in list {
            let parameter = resolver.deref(parameter).map_err(why)?;
            let key = |p: &Value| (p.get("name").cloned(), p.get("in").cloned());
            parameters.retain(|p| key(p) != key(parameter));
            parameters.push(parameter);
        }
    }
    // Path parameters first: theirs are the names the path slots need.
    parameters.sort_by_key(|p| p.get("in").and_then(Value::as_str) != Some("path"));
    let mut properties = Map::new();
    let mut required: Vec<Value> = Vec::new();
    let mut query = Map::new();
    let mut headers = Map::new();
    for parameter in &parameters {
        let name = parameter
            .get("name")
            .and_then(Value::as_str)
            .ok_or("a parameter has no name")?;
        let place = parameter.get("in").and_then(Value::as_str).unwrap_or("");
        if parameter.get("content").is_some() {
            return Err(format!(
                "parameter {name} is described by content, not a schema"
            ));
        }
        let schema = parameter.get("schema").cloned().unwrap_or(json!({}));
        let mut schema = resolver.input_schema(&schema).map_err(why)?;
        if let (Some(description), Value::Object(object)) =
            (parameter.get("description"), &mut schema)
        {
            object
                .entry("description")
                .or_insert_with(|| description.clone());
        }
        let style = parameter.get("style").and_then(Value::as_str);
        match place {
            "path" => {
                if style.is_some_and(|s| s != "simple") {
                    return Err(format!(
                        "path parameter {name} has style {}",
                        style.unwrap_or("")
                    ));
                }
                if !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                {
                    return Err(format!(
                        "path parameter {name:?} has a name a path slot cannot take"
                    ));
                }
            }
            "query" => {
                let style = match style.unwrap_or("form") {
                    "form" => "form",
                    "deepObject" => "deep_object",
                    "pipeDelimited" => "pipe_delimited",
                    "spaceDelimited" => "space_delimited",
                    other => return Err(format!("query parameter {name} has style {other}")),
                };
                let mut param = Map::new();
                if style != "form" {
                    param.insert("style".into(), style.into());
                }
                if let Some(explode) = parameter.get("explode").and_then(Value::as_bool) {
                    let default = matches!(style, "form" | "deep_object");
                    if explode != default {
                        param.insert("explode".into(), explode.into());
                    }
                }
                query.insert(name.to_owned(), Value::Object(param));
            }
            "header" => {
                if matches!(
                    name.to_ascii_lowercase().as_str(),
                    "authorization" | "content-type" | "accept"
                ) {
                    // The upstream's to send (its headers: or credentials:), not the model's.
                    continue;
                }
                headers.insert(name.to_owned(), json!({}));
            }
            "cookie" => return Err(format!("parameter {name} is a cookie")),
            other => return Err(format!("parameter {name} is in {other:?}")),
        }
        // A query or header parameter named like another parameter takes the argument
        // `{place}_{name}` (a path slot's argument is its name).
        let mut argument = name.to_owned();
        if properties.contains_key(&argument) {
            argument = format!("{place}_{name}");
            let entry = match place {
                "query" => query.get_mut(name),
                "header" => headers.get_mut(name),
                _ => None,
            };
            let Some(Value::Object(entry)) = entry else {
                return Err(format!("two parameters are named {name}"));
            };
            if properties.contains_key(&argument) {
                return Err(format!("two parameters are named {name}"));
            }
            entry.insert("argument".into(), argument.clone().into());
        }
        properties.insert(argument.clone(), schema);
        if place == "path" || parameter.get("required") == Some(&Value::Bool(true)) {
            required.push(argument.into());
        }
    }
    let mut body = None;
    let request_body = match operation.get("requestBody") {
        Some(body) => Some(resolver.deref(body).map_err(why)?),
        None => None,
    };
    // A GET or HEAD "body" that declares nothing (Stripe's describe one) is no body.
    let request_body = request_body
        .filter(|body| !(matches!(method, "get" | "head") && declares_nothing(resolver, body)));
    if let Some(request_body) = request_body {
        if matches!(method, "get" | "head") {
            return Err(format!("a {} request with a body", method.to_uppercase()));
        }
        let content = request_body
            .get("content")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        // JSON, or anything (`*/*`, as Kubernetes' description says): sent as JSON.
        let Some(media) = content
            .get("application/json")
            .or_else(|| content.get("*/*"))
        else {
            let types: Vec<&String> = content.keys().collect();
            return Err(format!("its request body is not JSON ({types:?})"));
        };
        let schema = resolver
            .input_schema(media.get("schema").unwrap_or(&json!({})))
            .map_err(why)?;
        let body_required = request_body.get("required") == Some(&Value::Bool(true));
        let fields = schema.get("properties").and_then(Value::as_object);
        let object = schema.get("type").and_then(Value::as_str) == Some("object")
            || (schema.get("type").is_none() && fields.is_some());
        let clash = fields.is_some_and(|f| f.keys().any(|k| properties.contains_key(k)));
        // An object body's properties become arguments; anything else (or one whose names
        // clash with the parameters') is one argument, `body`.
        if object && fields.is_some() && !clash {
            for (field, property) in fields.into_iter().flatten() {
                properties.insert(field.clone(), property.clone());
            }
            if let Some(Value::Array(names)) = schema.get("required") {
                required.extend(names.iter().cloned());
            }
            body = Some(json!("arguments"));
        } else {
            if properties.contains_key("body") {
                return Err("a parameter is named body, as its request body would be".into());
            }
            properties.insert("body".into(), schema);
            if body_required {
                required.push("body".into());
            }
            body = Some(json!({"argument": "body"}));
        }
    }
    let method_upper = method.to_uppercase();
    let mut http = Map::new();
    http.insert("upstream".into(), upstream.into());
    http.insert("method".into(), method_upper.clone().into());
    http.insert("path".into(), path.into());
    if !query.is_empty() {
        http.insert("query".into(), Value::Object(query));
    }
    if !headers.is_empty() {
        http.insert("headers".into(), Value::Object(headers));
    }
    match body {
        Some(body) if body != json!("arguments") || matches!(method, "delete") => {
            http.insert("body".into(), body);
        }
        Some(_) => {}
        // A POST, PUT or PATCH without a request body sends none.
        None if matches!(method, "post" | "put" | "patch") => {
            http.insert("body".into(), json!("none"));
        }
        None => {}
    }
    let risk = match method {
        "get" | "head" => "read_only",
        "delete" => "destructive",
        _ => "write_confirmed",
    };
    let mut input_schema = Map::new();
    input_schema.insert("type".into(), "object".into());
    input_schema.insert("properties".into(), Value::Object(properties));
    if !required.is_empty() {
        let mut seen = BTreeSet::new();
        required.retain(|r| seen.insert(r.to_string()));
        input_schema.insert("required".into(), Value::Array(required));
    }
    let mut entry = Map::new();
    entry.insert("name".into(), name.into());
    entry.insert(
        "description".into(),
        description(operation, &method_upper, path).into(),
    );
    entry.insert("risk_level".into(), risk.into());
    entry.insert("executor".into(), json!({ "http": http }));
    entry.insert("input_schema".into(), Value::Object(input_schema));
    Ok(Value::Object(entry))
}

/// Whether a request body declares no content worth sending: no media type, or only schemas
/// without properties.
fn declares_nothing(resolver: &Resolver<'_>, body: &Value) -> bool {
    body.get("content")
        .and_then(Value::as_object)
        .is_none_or(|content| {
            content.values().all(|media| {
                let schema = media.get("schema").map(|s| resolver.deref(s));
                match schema {
                    None => true,
                    Some(Ok(schema)) => {
                        schema
                            .get("properties")
                            .and_then(Value::as_object)
                            .is_none_or(Map::is_empty)
                            && schema
                                .get("additionalProperties")
                                .is_none_or(|a| a == &Value::Bool(false))
                    }
                    Some(Err(_)) => false,
                }
            })
        })
}

/// The operation's summary and description, bounded; `METHOD path` when it has neither.
fn description(operation: &Value, method: &str, path: &str) -> String {
    let text = |key: &str| {
        operation
            .get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
    };
    let mut out = match (text("summary"), text("description")) {
        (Some(summary), Some(description)) if description.starts_with(summary) => {
            description.to_owned()
        }
        (Some(summary), Some(description)) => format!("{summary}\n\n{description}"),
        (Some(one), None) | (None, Some(one)) => one.to_owned(),
        (None, None) => format!("{method} {path}"),
    };
    if out.len() > MAX_DESCRIPTION_BYTES {
        let mut end = MAX_DESCRIPTION_BYTES - 3;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r##"
openapi: 3.0.3
info: { title: Shop, version: "2" }
paths:
  /items/{id}:
    parameters:
      - { name: id, in: path, required: true, schema: { type: integer } }
    get:
      operationId: get item
      tags: [items]
      parameters:
        - { name: fields, in: query, style: form, explode: false, schema: { type: array, items: { type: string } } }
      responses: { "200": { description: ok } }
    patch:
      operationId: patchItem
      requestBody:
        required: true
        content: { application/json: { schema: { $ref: "#/components/schemas/Patch" } } }
      responses: { "200": { description: ok } }
    delete:
      operationId: deleteItem
      parameters:
        - { name: session, in: cookie, schema: { type: string } }
      responses: { "204": { description: gone } }
  /upload:
    post:
      operationId: upload
      requestBody:
        content: { multipart/form-data: { schema: { type: object } } }
      responses: { "200": { description: ok } }
  /trees:
    post:
      operationId: plant
      requestBody:
        content: { application/json: { schema: { $ref: "#/components/schemas/Tree" } } }
      responses: { "200": { description: ok } }
components:
  schemas:
    Patch:
      type: object
      properties:
        name: { type: string, nullable: true }
        id: { type: integer, readOnly: true }
    Tree:
      type: object
      properties: { children: { type: array, items: { $ref: "#/components/schemas/Tree" } } }
"##;

    fn imported(selection: &Selection) -> Imported {
        import(&parse(SPEC).unwrap(), "shop", selection).unwrap()
    }

    #[test]
    fn operations_become_entries_and_the_rest_are_listed_with_why() {
        let all = imported(&Selection::default());
        let names: Vec<&str> = all
            .tools
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["get_item", "patchItem"]);
        let get = &all.tools[0];
        assert_eq!(get["risk_level"], "read_only");
        assert_eq!(
            get["executor"]["http"],
            json!({"upstream": "shop", "method": "GET", "path": "/items/{id}",
                   "query": {"fields": {"explode": false}}})
        );
        assert_eq!(get["input_schema"]["required"], json!(["id"]));
        let patch = &all.tools[1];
        // 3.0 nullable as JSON Schema; the read-only id left out, so no clash with the path's.
        assert_eq!(
            patch["input_schema"]["properties"]["name"],
            json!({"type": ["string", "null"]})
        );
        assert_eq!(patch["executor"]["http"].get("body"), None);
        let skipped: Vec<String> = all
            .skipped
            .iter()
            .map(|(op, why)| format!("{op}: {why}"))
            .collect();
        assert_eq!(
            skipped,
            [
                "DELETE /items/{id} (deleteItem): parameter session is a cookie",
                "POST /upload (upload): its request body is not JSON ([\"multipart/form-data\"])",
                "POST /trees (plant): recursive schema (#/components/schemas/Tree → #/components/schemas/Tree)",
            ]
        );
    }

    #[test]
    fn a_selection_narrows_the_import() {
        let tagged = imported(&Selection {
            tags: vec!["items".into()],
            ..Selection::default()
        });
        assert_eq!(tagged.tools.len(), 1);
        let by_id = imported(&Selection {
            operations: vec!["patchItem".into()],
            ..Selection::default()
        });
        assert_eq!(by_id.tools[0]["name"], "patchItem");
        let prefixed = imported(&Selection {
            path_prefix: Some("/up".into()),
            ..Selection::default()
        });
        assert!(prefixed.tools.is_empty() && prefixed.skipped.len() == 1);
    }

    #[test]
    fn swagger_2_and_yaml_bombs_are_refused() {
        assert!(matches!(
            import(&json!({"swagger": "2.0"}), "u", &Selection::default()),
            Err(ImportError::Unsupported(_))
        ));
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..12 {
            let prev = if i == 0 {
                "a".to_owned()
            } else {
                format!("l{}", i - 1)
            };
            bomb.push_str(&format!(
                "l{i}: &l{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
        }
        assert!(matches!(parse(&bomb), Err(ImportError::Unreadable(_))));
    }
}
