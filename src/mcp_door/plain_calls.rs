//! `tools/call` from a 2025-11-25 host, answered without rmcp's per-request service. rmcp's
//! stateless transport gives every POST a service of its own, a task and channels: ~2.8 thread
//! wake-ups per call, against one on the gRPC door. A call in its plain shape — one every check
//! of rmcp's transport lets through unchanged — is answered here, by the same handler code and
//! in the same JSON rmcp writes. Anything else (another revision, an `Origin`, an unusual
//! `Accept` or `Host`, a session, a batch, a body that does not parse) goes on to rmcp as it came,
//! so every refusal the transport makes stays rmcp's.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use rmcp::model::{
    CallToolResponse, ClientJsonRpcMessage, ClientRequest, GetMeta, ServerJsonRpcMessage,
    ServerResult,
};

use super::handler::{Asked, Handler, caller};

/// The revision whose plain calls are answered here. 2026-07-28 requests carry per-request
/// metadata and standard headers that rmcp negotiates and checks; they stay with rmcp.
const PLAIN_REVISION: &str = "2025-11-25";

const MCP_PROTOCOL_VERSION: &str = "mcp-protocol-version";
const MCP_SESSION_ID: &str = "mcp-session-id";

/// What the plain-call path needs.
pub struct PlainCalls {
    pub handler: Arc<Handler>,
    /// rmcp's allowed `Host` values; only an exact match is taken here.
    pub allowed_hosts: Vec<String>,
    pub max_body_bytes: usize,
}

impl PlainCalls {
    /// Whether the headers are ones rmcp's transport lets through for a stateless 2025-11-25
    /// request, judged strictly: a header rmcp would also accept but that is not in its plain
    /// form sends the request to rmcp.
    fn plain_headers(&self, headers: &HeaderMap) -> bool {
        let one = |name: &str| {
            let mut values = headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(value), None) => value.to_str().ok(),
                _ => None,
            }
        };
        let host_allowed = one(header::HOST.as_str())
            .is_some_and(|host| self.allowed_hosts.iter().any(|allowed| allowed == host));
        let accepts = one(header::ACCEPT.as_str()).is_some_and(|accept| {
            let mut json = false;
            let mut sse = false;
            for essence in accept.split(',').map(str::trim) {
                json |= essence == "application/json";
                sse |= essence == "text/event-stream";
            }
            json && sse
        });
        let length = one(header::CONTENT_LENGTH.as_str())
            .and_then(|length| length.parse::<usize>().ok())
            .is_some_and(|length| length <= self.max_body_bytes);
        host_allowed
            && accepts
            && length
            && one(header::CONTENT_TYPE.as_str()) == Some("application/json")
            && one(MCP_PROTOCOL_VERSION) == Some(PLAIN_REVISION)
            && !headers.contains_key(header::ORIGIN)
            && !headers.contains_key(MCP_SESSION_ID)
    }
}

/// The middleware in front of rmcp's service, inside admission and the cancellation notices:
/// answers a plain `tools/call`, passes everything else on.
pub async fn answer(
    State(plain): State<Arc<PlainCalls>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != http::Method::POST || !plain.plain_headers(request.headers()) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, plain.max_body_bytes).await {
        Ok(body) => body,
        Err(err) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {err}"),
            )
                .into_response();
        }
    };
    let Ok(ClientJsonRpcMessage::Request(request)) =
        serde_json::from_slice::<ClientJsonRpcMessage>(&body)
    else {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    };
    let (id, mut client_request) = (request.id, request.request);
    // A revision named in `_meta` is negotiated per request: rmcp's.
    if client_request.get_meta().protocol_version().is_some() {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    }
    // As rmcp does, the request's `_meta` is taken out for the handler.
    let meta = std::mem::take(client_request.get_meta_mut());
    let ClientRequest::CallToolRequest(call) = client_request else {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    };
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
                Ok((outcome, _)) => {
                    let result = plain.handler.tool_result(outcome, &caller);
                    let mut result = ServerResult::from(CallToolResponse::from(result));
                    // The wire shape of results before 2026-07-28, as rmcp's handler gives it.
                    result.strip_result_type_for_legacy_peer();
                    result.strip_non_object_output_for_legacy_peer();
                    Ok(result)
                }
                Err(error) => Err(error),
            }
        }
        Err(error) => Err(error),
    };
    let message = match answer {
        Ok(result) => ServerJsonRpcMessage::response(result, id),
        Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
    };
    match serde_json::to_vec(&message) {
        Ok(json) => (
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
