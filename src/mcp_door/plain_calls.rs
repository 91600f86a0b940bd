//! A `tools/call` answered without rmcp's per-request service. rmcp's stateless transport gives
//! every POST a service of its own, a task and channels: ~2.8 thread wake-ups per call, against
//! one on the gRPC door. A call in its plain shape — one every check of rmcp's transport lets
//! through unchanged — is answered here, by the same handler code, in the same JSON and with the
//! same HTTP status rmcp gives it. Anything else (another revision, an `Origin`, an unusual
//! `Accept`, `Host` or `Mcp-Name`, a session, a batch, `_meta` missing what 2026-07-28 requires, a
//! body that does not parse) goes on to rmcp as it came, so every refusal the transport makes
//! stays rmcp's.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ErrorCode, GetMeta, ProtocolVersion, ServerJsonRpcMessage,
    ServerResult,
};

use super::handler::{Asked, Handler, Revision, caller, opens_urls};

const MCP_PROTOCOL_VERSION: &str = "mcp-protocol-version";
const MCP_SESSION_ID: &str = "mcp-session-id";
const MCP_METHOD: &str = "mcp-method";
const MCP_NAME: &str = "mcp-name";

/// The revisions whose plain calls are answered here, as the revision header names them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plain {
    /// 2025-11-25: no revision in `_meta`.
    V2025_11_25,
    /// 2026-07-28: the revision and the client's capabilities in `_meta`, `Mcp-Method` and
    /// `Mcp-Name` headers matching the body.
    V2026_07_28,
}

/// What the plain-call path needs.
pub struct PlainCalls {
    pub handler: Arc<Handler>,
    /// rmcp's allowed `Host` values; only an exact match is taken here.
    pub allowed_hosts: Vec<String>,
    pub max_body_bytes: usize,
}

/// The header's only value, if it has exactly one and it is text.
fn one<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok(),
        _ => None,
    }
}

impl PlainCalls {
    /// The revision of a request whose headers rmcp's transport lets through unchanged, judged
    /// strictly: a header rmcp would also accept but that is not in its plain form sends the
    /// request to rmcp (`None`).
    fn plain_headers(&self, headers: &HeaderMap) -> Option<Plain> {
        let host_allowed = one(headers, header::HOST.as_str())
            .is_some_and(|host| self.allowed_hosts.iter().any(|allowed| allowed == host));
        let accepts = one(headers, header::ACCEPT.as_str()).is_some_and(|accept| {
            let mut json = false;
            let mut sse = false;
            for essence in accept.split(',').map(str::trim) {
                json |= essence == "application/json";
                sse |= essence == "text/event-stream";
            }
            json && sse
        });
        let length = one(headers, header::CONTENT_LENGTH.as_str())
            .and_then(|length| length.parse::<usize>().ok())
            .is_some_and(|length| length <= self.max_body_bytes);
        let plain = host_allowed
            && accepts
            && length
            && one(headers, header::CONTENT_TYPE.as_str()) == Some("application/json")
            && !headers.contains_key(header::ORIGIN)
            && !headers.contains_key(MCP_SESSION_ID);
        if !plain {
            return None;
        }
        match one(headers, MCP_PROTOCOL_VERSION)? {
            "2025-11-25" => Some(Plain::V2025_11_25),
            "2026-07-28" => Some(Plain::V2026_07_28),
            _ => None,
        }
    }
}

/// Whether rmcp's `Mcp-Method`/`Mcp-Name` check passes a `tools/call` of `tool` unchanged: both
/// present once, equal to the body's, and the name plain text (rmcp decodes Base64 forms).
fn plain_standard_headers(headers: &HeaderMap, tool: &str) -> bool {
    let plain_name = !tool.is_empty()
        && tool
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./:".contains(&b));
    plain_name
        && one(headers, MCP_METHOD) == Some("tools/call")
        && one(headers, MCP_NAME) == Some(tool)
}

/// The HTTP status rmcp gives a 2026-07-28 answer (a well-formed `_meta`): some protocol errors
/// are HTTP errors too.
fn modern_status(message: &ServerJsonRpcMessage) -> StatusCode {
    let ServerJsonRpcMessage::Error(error) = message else {
        return StatusCode::OK;
    };
    match error.error.code {
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
        | ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        | ErrorCode::HEADER_MISMATCH => StatusCode::BAD_REQUEST,
        ErrorCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// The middleware in front of rmcp's service, inside admission and the cancellation notices:
/// answers a plain `tools/call`, passes everything else on.
pub async fn answer(
    State(plain): State<Arc<PlainCalls>>,
    request: Request,
    next: Next,
) -> Response {
    let asked = match request.method() == http::Method::POST {
        true => plain.plain_headers(request.headers()),
        false => None,
    };
    let Some(asked_revision) = asked else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let body = match super::read_body(body, plain.max_body_bytes).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    // Most other requests (initialize, tools/list) are not parsed twice.
    if memchr::memmem::find(&body, b"tools/call").is_none() {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    }
    let Ok(ClientJsonRpcMessage::Request(request)) =
        serde_json::from_slice::<ClientJsonRpcMessage>(&body)
    else {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    };
    let (id, mut client_request) = (request.id, request.request);
    let meta = client_request.get_meta();
    let revision = match (asked_revision, meta.protocol_version()) {
        (Plain::V2025_11_25, None) => Revision::Legacy,
        (Plain::V2026_07_28, Some(version))
            if version == ProtocolVersion::V_2026_07_28
                && meta
                    .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                    .is_empty() =>
        {
            Revision::Modern
        }
        // A revision negotiated otherwise, or `_meta` short of what it needs: rmcp's.
        _ => return next.run(Request::from_parts(parts, Body::from(body))).await,
    };
    // As rmcp does, the request's `_meta` is taken out for the handler.
    let meta = std::mem::take(client_request.get_meta_mut());
    let ClientRequest::CallToolRequest(call) = client_request else {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    };
    if asked_revision == Plain::V2026_07_28
        && !plain_standard_headers(&parts.headers, &call.params.name)
    {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    }
    let answer = match caller(Some(&parts)) {
        Ok(caller) => {
            let asked = Asked {
                caller: &caller,
                params: &call.params,
                meta: &meta,
                parts: Some(&parts),
                id: &id,
            };
            // Dropping this future (the host went away) is the cancellation.
            match plain.handler.execute(asked, std::future::pending()).await {
                Ok((outcome, redeemed)) => {
                    // The capabilities come with every 2026-07-28 request (checked above).
                    let response = plain.handler.respond(
                        outcome,
                        redeemed,
                        &caller,
                        &call.params,
                        revision,
                        || opens_urls(meta.client_capabilities()),
                    );
                    let mut result = ServerResult::from(response);
                    // The wire shape of each revision's results, as rmcp's handler gives it.
                    match revision {
                        Revision::Legacy => {
                            result.strip_result_type_for_legacy_peer();
                            result.strip_non_object_output_for_legacy_peer();
                        }
                        Revision::Modern => result.fill_missing_cache_hints(),
                    }
                    Ok(result)
                }
                Err(error) => Err(error),
            }
        }
        Err(error) => Err(error),
    };
    let message = match answer {
        Ok(result) => ServerJsonRpcMessage::response(result, id),
        Err(mut error) => {
            // As rmcp's handler answers a 2026-07-28 host.
            if matches!(revision, Revision::Modern) && error.code == ErrorCode::RESOURCE_NOT_FOUND {
                error.code = ErrorCode::INVALID_PARAMS;
            }
            ServerJsonRpcMessage::error(error, Some(id))
        }
    };
    let status = match revision {
        Revision::Legacy => StatusCode::OK,
        Revision::Modern => modern_status(&message),
    };
    match serde_json::to_vec(&message) {
        Ok(json) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json,
        )
            .into_response(),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the result could not be written: {err}"),
        )
            .into_response(),
    }
}
