//! How an HTTP tool's arguments become its request (docs/executors.md#request-mapping): the
//! method, a path template whose `{slots}` take arguments as single percent-encoded segments,
//! query parameters in OpenAPI's styles, headers from arguments and a JSON body. Validated once
//! at load against the tool's input schema; [`RequestMapping::request`] applies it to a permitted
//! call's (bound) arguments, refusing values that cannot be sent as asked rather than sending
//! something else.

use std::collections::{BTreeMap, BTreeSet};

use http::{HeaderName, HeaderValue, Method};
use serde_json::{Map, Value};
use url::Url;

use crate::settings::{
    FieldError,
    raw::{
        RawHttpBody, RawHttpBodyArgument, RawHttpBodyKeyword, RawHttpExecutor, RawHttpMethod,
        RawQueryStyle,
    },
};

/// The validated mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMapping {
    pub method: Method,
    /// The path under the upstream's URL, in parts.
    path: Vec<PathPart>,
    query: Vec<QueryParam>,
    headers: Vec<HeaderParam>,
    body: Body,
    /// `None`: any 2xx.
    success: Option<BTreeSet<u16>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PathPart {
    Literal(String),
    /// The argument whose value fills the slot.
    Slot(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct QueryParam {
    name: String,
    argument: String,
    style: RawQueryStyle,
    explode: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HeaderParam {
    name: HeaderName,
    argument: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    None,
    /// The arguments no other part took.
    Arguments,
    Argument(String),
}

/// The longest URL a call may make (path and query), in bytes.
pub const MAX_URL_BYTES: usize = 8 * 1024;

/// Headers an argument may never set: the transport's, and those the sidecar sets itself.
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "connection",
    "content-length",
    "content-type",
    "cookie",
    "expect",
    "host",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "traceparent",
    "tracestate",
    "x-request-id",
    "x-toolgate-call-id",
    "x-toolgate-delegation",
];

/// A request built from a call's arguments.
#[derive(Debug)]
pub struct BuiltRequest {
    pub url: Url,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON body, if the request has one.
    pub body: Option<Vec<u8>>,
}

/// Why a call's arguments cannot be sent as the mapping asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MappingError(pub String);

impl RequestMapping {
    /// Validates `raw` for a tool whose input schema is `schema`; `static_headers` are the
    /// upstream's configured (possibly secret) header names. `at` names the executor's field.
    pub fn build(
        raw: &RawHttpExecutor,
        schema: &Value,
        static_headers: &BTreeSet<String>,
        at: &str,
    ) -> Result<Self, FieldError> {
        let method = match raw.method.unwrap_or(RawHttpMethod::Post) {
            RawHttpMethod::Get => Method::GET,
            RawHttpMethod::Post => Method::POST,
            RawHttpMethod::Put => Method::PUT,
            RawHttpMethod::Patch => Method::PATCH,
            RawHttpMethod::Delete => Method::DELETE,
            RawHttpMethod::Head => Method::HEAD,
        };
        let declared: Option<BTreeSet<&str>> = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().map(String::as_str).collect());
        let required: BTreeSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut taken: BTreeMap<String, String> = BTreeMap::new();
        let mut take = |argument: &str, by: String, field: String| -> Result<(), FieldError> {
            if let Some(declared) = &declared
                && !declared.contains(argument)
            {
                return Err(FieldError::new(
                    field,
                    format!(
                        "{by} takes argument {argument:?}, which the input schema does not declare"
                    ),
                ));
            }
            if let Some(first) = taken.insert(argument.to_owned(), by.clone()) {
                return Err(FieldError::new(
                    field,
                    format!("argument {argument:?} is taken by both {first} and {by}"),
                ));
            }
            Ok(())
        };

        let path = parse_template(&raw.path, &format!("{at}.path"))?;
        for part in &path {
            if let PathPart::Slot(argument) = part {
                take(
                    argument,
                    format!("path slot {{{argument}}}"),
                    format!("{at}.path"),
                )?;
                if !required.contains(argument.as_str()) {
                    return Err(FieldError::new(
                        format!("{at}.path"),
                        format!(
                            "path slot {{{argument}}} needs argument {argument:?} to be required in the input schema"
                        ),
                    ));
                }
            }
        }
        let mut query = Vec::new();
        for (name, param) in &raw.query {
            let field = format!("{at}.query.{name}");
            if name.is_empty() {
                return Err(FieldError::new(field, "a query parameter needs a name"));
            }
            let argument = param.argument.clone().unwrap_or_else(|| name.clone());
            take(
                &argument,
                format!("query parameter {name:?}"),
                field.clone(),
            )?;
            let style = param.style.unwrap_or(RawQueryStyle::Form);
            let explode = param.explode.unwrap_or(matches!(
                style,
                RawQueryStyle::Form | RawQueryStyle::DeepObject
            ));
            if style == RawQueryStyle::DeepObject && !explode {
                return Err(FieldError::new(field, "deep_object is always exploded"));
            }
            query.push(QueryParam {
                name: name.clone(),
                argument,
                style,
                explode,
            });
        }
        let mut headers = Vec::new();
        for (name, param) in &raw.headers {
            let field = format!("{at}.headers.{name}");
            let header = HeaderName::try_from(name.as_str())
                .map_err(|_| FieldError::new(&field, format!("invalid header name {name:?}")))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(FieldError::new(
                    field,
                    format!(
                        "header {name:?} is set by the sidecar or the transport, never from an argument"
                    ),
                ));
            }
            if static_headers.iter().any(|h| h.eq_ignore_ascii_case(name)) {
                return Err(FieldError::new(
                    field,
                    format!(
                        "header {name:?} is one of the upstream's configured headers (a secret, perhaps): an argument cannot set it"
                    ),
                ));
            }
            let argument = param.argument.clone().unwrap_or_else(|| name.clone());
            take(&argument, format!("header {name:?}"), field)?;
            headers.push(HeaderParam {
                name: header,
                argument,
            });
        }
        let body = match &raw.body {
            Some(RawHttpBody::Keyword(RawHttpBodyKeyword::None)) => Body::None,
            Some(RawHttpBody::Keyword(RawHttpBodyKeyword::Arguments)) => Body::Arguments,
            Some(RawHttpBody::Argument(RawHttpBodyArgument { argument })) => {
                take(argument, "the body".into(), format!("{at}.body"))?;
                Body::Argument(argument.clone())
            }
            None if matches!(method, Method::GET | Method::HEAD | Method::DELETE) => Body::None,
            None => Body::Arguments,
        };
        if matches!(method, Method::GET | Method::HEAD) && body != Body::None {
            return Err(FieldError::new(
                format!("{at}.body"),
                format!("a {method} request has no body"),
            ));
        }
        // Every declared argument has a place, so none is dropped.
        if body != Body::Arguments
            && let Some(declared) = &declared
            && let Some(lost) = declared.iter().find(|a| !taken.contains_key(**a))
        {
            return Err(FieldError::new(
                at,
                format!(
                    "argument {lost:?} goes nowhere in the request: give it a path slot, a query parameter or a header, or send the arguments as the body"
                ),
            ));
        }
        let success = match &raw.success_statuses {
            None => None,
            Some(statuses) => {
                if statuses.is_empty() || statuses.iter().any(|s| !(100..=599).contains(s)) {
                    return Err(FieldError::new(
                        format!("{at}.success_statuses"),
                        "list HTTP statuses between 100 and 599",
                    ));
                }
                Some(statuses.iter().copied().collect())
            }
        };
        Ok(RequestMapping {
            method,
            path,
            query,
            headers,
            body,
            success,
        })
    }

    /// Whether a response status means success.
    pub fn is_success(&self, status: u16) -> bool {
        match &self.success {
            Some(statuses) => statuses.contains(&status),
            None => (200..300).contains(&status),
        }
    }

    /// The path's literal text with its slots as `{name}`, for messages.
    pub fn path_template(&self) -> String {
        self.path
            .iter()
            .map(|part| match part {
                PathPart::Literal(text) => text.clone(),
                PathPart::Slot(name) => format!("{{{name}}}"),
            })
            .collect()
    }

    /// The request for a call's (validated, bound) `arguments` under the upstream's `base`.
    pub fn request(&self, base: &Url, arguments: &Value) -> Result<BuiltRequest, MappingError> {
        let empty = Map::new();
        let arguments = arguments.as_object().unwrap_or(&empty);
        let mut path = base.path().trim_end_matches('/').to_owned();
        let mut template = String::new();
        for part in &self.path {
            match part {
                PathPart::Literal(text) => {
                    template.push_str(text);
                }
                PathPart::Slot(name) => {
                    let value = arguments.get(name).ok_or_else(|| {
                        MappingError(format!("argument {name} fills a path slot and is missing"))
                    })?;
                    template.push_str(&segment(name, value)?);
                }
            }
        }
        if template.is_empty() {
            // No path: the upstream's URL as configured (as it always was).
            path = base.path().to_owned();
        } else {
            path.push('/');
            path.push_str(template.trim_start_matches('/'));
        }
        let mut url = base.clone();
        url.set_path(&path);
        // The url crate normalizes as it sets: what it holds must be exactly what was built,
        // or a value changed the path (it cannot, by `segment`; checked regardless).
        if url.path() != path {
            return Err(MappingError(
                "the arguments would change the request's path".into(),
            ));
        }
        // The upstream URL's own query (an `api-version=…`, say) stays, first.
        let base_query = base.query().unwrap_or("");
        let mut query = url::form_urlencoded::Serializer::for_suffix(base_query.to_owned(), 0);
        let mut any_query = !base_query.is_empty();
        for param in &self.query {
            let Some(value) = arguments.get(&param.argument).filter(|v| !v.is_null()) else {
                continue;
            };
            for (name, text) in query_pairs(param, value)? {
                query.append_pair(&name, &text);
                any_query = true;
            }
        }
        url.set_query(any_query.then(|| query.finish()).as_deref());
        let length = url.path().len() + url.query().map_or(0, str::len);
        if length > MAX_URL_BYTES {
            return Err(MappingError(format!(
                "the request's path and query would be {length} bytes; the limit is {MAX_URL_BYTES}"
            )));
        }
        let mut headers = Vec::new();
        for param in &self.headers {
            let Some(value) = arguments.get(&param.argument).filter(|v| !v.is_null()) else {
                continue;
            };
            let text = scalar(value).ok_or_else(|| {
                MappingError(format!(
                    "argument {} is sent as header {} and must be a string, number or boolean",
                    param.argument, param.name
                ))
            })?;
            // Refuses CR, LF and other control characters: no header can be smuggled in.
            let value = HeaderValue::from_str(&text).map_err(|_| {
                MappingError(format!(
                    "argument {} cannot be sent as header {}: it holds a control character or non-ASCII text",
                    param.argument, param.name
                ))
            })?;
            headers.push((param.name.clone(), value));
        }
        let body = match &self.body {
            Body::None => {
                let placed = |name: &str| self.places(name);
                if let Some(lost) = arguments.keys().find(|name| !placed(name)) {
                    return Err(MappingError(format!(
                        "argument {lost} has no place in the request (it has no body)"
                    )));
                }
                None
            }
            Body::Argument(name) => Some(
                serde_json::to_vec(arguments.get(name).unwrap_or(&Value::Null))
                    .map_err(|err| MappingError(format!("cannot encode the body: {err}")))?,
            ),
            Body::Arguments => {
                let rest: Map<String, Value> = arguments
                    .iter()
                    .filter(|(name, _)| !self.places(name))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                Some(
                    serde_json::to_vec(&rest)
                        .map_err(|err| MappingError(format!("cannot encode the body: {err}")))?,
                )
            }
        };
        Ok(BuiltRequest { url, headers, body })
    }

    /// Whether the path, query or headers take argument `name`.
    fn places(&self, name: &str) -> bool {
        self.path
            .iter()
            .any(|p| matches!(p, PathPart::Slot(slot) if slot == name))
            || self.query.iter().any(|q| q.argument == name)
            || self.headers.iter().any(|h| h.argument == name)
    }
}

/// Splits a path template into literal text and `{slot}`s.
fn parse_template(template: &str, at: &str) -> Result<Vec<PathPart>, FieldError> {
    let mut parts = Vec::new();
    let mut rest = template;
    let mut slots = BTreeSet::new();
    while let Some(open) = rest.find('{') {
        let (literal, after) = rest.split_at(open);
        if literal.contains('}') {
            return Err(FieldError::new(
                at,
                format!("unmatched }} in path {template:?}"),
            ));
        }
        if !literal.is_empty() {
            parts.push(PathPart::Literal(literal.to_owned()));
        }
        let close = after
            .find('}')
            .ok_or_else(|| FieldError::new(at, format!("unclosed {{ in path {template:?}")))?;
        let name = &after[1..close];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(FieldError::new(
                at,
                format!("invalid path slot {{{name}}}: use A-Z a-z 0-9 _ - ."),
            ));
        }
        if !slots.insert(name.to_owned()) {
            return Err(FieldError::new(
                at,
                format!("path slot {{{name}}} appears twice"),
            ));
        }
        parts.push(PathPart::Slot(name.to_owned()));
        rest = &after[close + 1..];
    }
    if rest.contains('}') {
        return Err(FieldError::new(
            at,
            format!("unmatched }} in path {template:?}"),
        ));
    }
    if !rest.is_empty() {
        parts.push(PathPart::Literal(rest.to_owned()));
    }
    for part in &parts {
        if let PathPart::Literal(text) = part
            && (text.contains('?') || text.contains('#'))
        {
            return Err(FieldError::new(
                at,
                "the path holds no query or fragment: use query: for parameters",
            ));
        }
    }
    Ok(parts)
}

/// Characters left as they are in a path segment: RFC 3986's unreserved ones. Everything else
/// (`/`, `%`, `?`, `#`, `;`, spaces, …) is percent-encoded.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A scalar argument as one path segment. `.` and `..` (however spelled) would move the path,
/// and an empty segment would change its shape: refused.
fn segment(name: &str, value: &Value) -> Result<String, MappingError> {
    let text = scalar(value).ok_or_else(|| {
        MappingError(format!(
            "argument {name} fills a path slot and must be a string, number or boolean"
        ))
    })?;
    if text.is_empty() || text == "." || text == ".." {
        return Err(MappingError(format!(
            "argument {name} cannot be a path segment: {text:?}"
        )));
    }
    Ok(percent_encoding::utf8_percent_encode(&text, SEGMENT).to_string())
}

/// A string as it is; a number or boolean as its JSON text; anything else `None`.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The `(name, value)` pairs one query parameter writes, in its style.
fn query_pairs(param: &QueryParam, value: &Value) -> Result<Vec<(String, String)>, MappingError> {
    let name = &param.name;
    let nested = || {
        MappingError(format!(
            "argument {} is sent as query parameter {name} and cannot hold nested arrays or objects",
            param.argument
        ))
    };
    match value {
        Value::Array(items) => {
            let texts = items
                .iter()
                .map(|item| scalar(item).ok_or_else(nested))
                .collect::<Result<Vec<_>, _>>()?;
            if param.explode && param.style == RawQueryStyle::Form {
                return Ok(texts.into_iter().map(|t| (name.clone(), t)).collect());
            }
            let separator = match param.style {
                RawQueryStyle::PipeDelimited => "|",
                RawQueryStyle::SpaceDelimited => " ",
                _ => ",",
            };
            Ok(vec![(name.clone(), texts.join(separator))])
        }
        Value::Object(fields) => {
            let pairs = fields
                .iter()
                .map(|(k, v)| scalar(v).map(|t| (k.clone(), t)).ok_or_else(nested))
                .collect::<Result<Vec<_>, _>>()?;
            match (param.style, param.explode) {
                (RawQueryStyle::DeepObject, _) => Ok(pairs
                    .into_iter()
                    .map(|(k, v)| (format!("{name}[{k}]"), v))
                    .collect()),
                (RawQueryStyle::Form, true) => Ok(pairs),
                (RawQueryStyle::Form, false) => Ok(vec![(
                    name.clone(),
                    pairs
                        .into_iter()
                        .flat_map(|(k, v)| [k, v])
                        .collect::<Vec<_>>()
                        .join(","),
                )]),
                _ => Err(MappingError(format!(
                    "argument {} is an object; query parameter {name}'s style takes arrays or scalars",
                    param.argument
                ))),
            }
        }
        other => Ok(vec![(name.clone(), scalar(other).ok_or_else(nested)?)]),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mapping(yaml: &str, schema: Value) -> Result<RequestMapping, FieldError> {
        let raw: RawHttpExecutor = serde_yaml_ng::from_str(yaml).unwrap();
        RequestMapping::build(
            &raw,
            &schema,
            &BTreeSet::from(["x-api-key".to_owned()]),
            "t",
        )
    }

    fn request(yaml: &str, schema: Value, arguments: Value) -> Result<BuiltRequest, MappingError> {
        let base = Url::parse("http://api.test/v1/").unwrap();
        mapping(yaml, schema).unwrap().request(&base, &arguments)
    }

    fn schema(props: &[&str], required: &[&str]) -> Value {
        let properties: Map<String, Value> =
            props.iter().map(|p| (p.to_string(), json!({}))).collect();
        json!({"type": "object", "properties": properties, "required": required})
    }

    #[test]
    fn path_slots_are_single_encoded_segments_and_cannot_move_the_path() {
        let yaml = "{ upstream: u, method: GET, path: \"/invoices/{id}/lines\" }";
        let s = schema(&["id"], &["id"]);
        let url =
            |id: Value| request(yaml, s.clone(), json!({"id": id})).map(|r| r.url.to_string());
        assert_eq!(
            url(json!("A-1")).unwrap(),
            "http://api.test/v1/invoices/A-1/lines"
        );
        assert_eq!(
            url(json!(42)).unwrap(),
            "http://api.test/v1/invoices/42/lines"
        );
        assert_eq!(
            url(json!("../admin")).unwrap(),
            "http://api.test/v1/invoices/..%2Fadmin/lines"
        );
        assert_eq!(
            url(json!("a%2Fb?x#y")).unwrap(),
            "http://api.test/v1/invoices/a%252Fb%3Fx%23y/lines"
        );
        for bad in [
            json!(".."),
            json!("."),
            json!(""),
            json!({"a": 1}),
            json!([1]),
        ] {
            assert!(url(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn query_styles_follow_openapi() {
        let yaml = "{ upstream: u, method: GET, path: \"/s\", query: { id: {}, csv: { style: form, explode: false }, pipes: { style: pipe_delimited }, filter: { style: deep_object }, q: {} } }";
        let s = schema(&["id", "csv", "pipes", "filter", "q"], &[]);
        let built = request(
            yaml,
            s,
            json!({"id": [1, 2], "csv": ["a", "b"], "pipes": ["x", "y"],
                   "filter": {"status": "open", "team": 7}, "q": "a&b=c"}),
        )
        .unwrap();
        assert_eq!(
            built.url.query().unwrap(),
            "csv=a%2Cb&filter%5Bstatus%5D=open&filter%5Bteam%5D=7&id=1&id=2&pipes=x%7Cy&q=a%26b%3Dc"
        );
        assert!(built.body.is_none());
    }

    #[test]
    fn headers_refuse_control_characters_and_the_rest_is_the_body() {
        let yaml = "{ upstream: u, method: POST, path: \"/t/{id}\", headers: { x-trace-tag: { argument: tag } } }";
        let s = schema(&["id", "tag", "title"], &["id"]);
        let built = request(
            yaml,
            s.clone(),
            json!({"id": "7", "tag": "t1", "title": "x"}),
        )
        .unwrap();
        assert_eq!(built.headers[0].1, "t1");
        assert_eq!(built.body.unwrap(), br#"{"title":"x"}"#);
        let smuggled = request(yaml, s, json!({"id": "7", "tag": "a\r\nx-admin: 1"}));
        assert!(smuggled.unwrap_err().0.contains("control character"));
    }

    #[test]
    fn contradictions_are_refused_at_load() {
        let s = schema(&["id", "x"], &["id"]);
        for (yaml, says) in [
            ("{ upstream: u, path: \"/a/{nope}\" }", "does not declare"),
            ("{ upstream: u, path: \"/a/{x}\" }", "to be required"),
            (
                "{ upstream: u, method: GET, path: \"/a/{id}\" }",
                "goes nowhere",
            ),
            (
                "{ upstream: u, method: GET, path: \"/a/{id}\", body: arguments }",
                "has no body",
            ),
            (
                "{ upstream: u, path: \"/a/{id}\", headers: { x-api-key: { argument: x } } }",
                "configured headers",
            ),
            (
                "{ upstream: u, path: \"/a/{id}\", headers: { host: { argument: x } } }",
                "never from an argument",
            ),
            (
                "{ upstream: u, path: \"/a/{id}\", query: { id: {} } }",
                "taken by both",
            ),
            ("{ upstream: u, path: \"/a/{id}?x=1\" }", "no query"),
            ("{ upstream: u, path: \"/a/{id\", method: GET }", "unclosed"),
            (
                "{ upstream: u, path: \"/a/{id}\", success_statuses: [700] }",
                "between 100",
            ),
        ] {
            let err = mapping(yaml, s.clone()).unwrap_err();
            assert!(err.message.contains(says), "{yaml}: {}", err.message);
        }
    }

    #[test]
    fn a_tool_without_a_path_calls_the_upstream_s_url() {
        let raw: RawHttpExecutor = serde_yaml_ng::from_str("{ upstream: u }").unwrap();
        let mapping =
            RequestMapping::build(&raw, &json!({"type": "object"}), &BTreeSet::new(), "t").unwrap();
        for (base, url) in [
            ("http://api.test", "http://api.test/"),
            ("http://api.test/", "http://api.test/"),
            ("http://api.test/v1", "http://api.test/v1"),
            ("http://api.test/v1/", "http://api.test/v1/"),
        ] {
            let built = mapping
                .request(&Url::parse(base).unwrap(), &json!({"a": 1}))
                .unwrap();
            assert_eq!(built.url.as_str(), url, "{base}");
            assert_eq!(built.body.unwrap(), br#"{"a":1}"#);
        }
    }

    #[test]
    fn the_upstream_url_s_own_query_stays() {
        let raw: RawHttpExecutor =
            serde_yaml_ng::from_str("{ upstream: u, method: GET, path: /items, query: { q: {} } }")
                .unwrap();
        let mapping =
            RequestMapping::build(&raw, &schema(&["q"], &[]), &BTreeSet::new(), "t").unwrap();
        let base = Url::parse("http://api.test/v1?api-version=2024-01").unwrap();
        let with = mapping.request(&base, &json!({"q": "a b"})).unwrap();
        assert_eq!(
            with.url.as_str(),
            "http://api.test/v1/items?api-version=2024-01&q=a+b"
        );
        let without = mapping.request(&base, &json!({})).unwrap();
        assert_eq!(
            without.url.as_str(),
            "http://api.test/v1/items?api-version=2024-01"
        );
    }

    #[test]
    fn an_oversized_query_is_refused() {
        let yaml = "{ upstream: u, method: GET, query: { q: {} } }";
        let err = request(
            yaml,
            schema(&["q"], &[]),
            json!({"q": "x".repeat(MAX_URL_BYTES)}),
        );
        assert!(err.unwrap_err().0.contains("the limit is"));
    }
}
