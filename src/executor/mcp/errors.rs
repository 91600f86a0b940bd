//! How a failed MCP call becomes an [`ExecError`], and the JSON-RPC error toolgate itself answers
//! a call with when the server's reply was over its size limit (the stdio framing and the HTTP
//! client write it; [`call_error`] recognises it).

use rmcp::{
    model::{ErrorCode, ErrorData},
    service::ServiceError,
};
use serde_json::Value;

use crate::executor::ExecError;

/// Maps a failed call: a message over the limit, the server's own JSON-RPC error (a failure of
/// the tool, not an outage), or a broken connection (retryable).
pub(super) fn call_error(server: &str, tool: &str, err: ServiceError) -> ExecError {
    match err {
        ServiceError::McpError(error) if is_oversized(&error) => {
            ExecError::OutputTooLarge(format!(
                "MCP server {server} answered with a message over its limit of {} bytes",
                error
                    .data
                    .as_ref()
                    .and_then(|d| d.get("limit"))
                    .and_then(Value::as_u64)
                    .unwrap_or_default()
            ))
        }
        // rmcp reports a connection that closed under a pending call as an error "from" it.
        ServiceError::McpError(error)
            if error
                .data
                .as_ref()
                .is_some_and(|d| d.get("io.modelcontextprotocol/transportClosed").is_some()) =>
        {
            tracing::warn!(server = %server, tool = %tool, "MCP connection closed during a call");
            ExecError::Unavailable(format!("MCP server {server} did not answer the call"))
        }
        ServiceError::McpError(error) => ExecError::failed_with(
            format!("MCP server {server} refused the call ({})", error.code.0),
            error.message.into_owned(),
        ),
        other => {
            tracing::warn!(server = %server, tool = %tool, error = %other, "MCP call failed");
            ExecError::Unavailable(format!("MCP server {server} did not answer the call"))
        }
    }
}

/// The JSON-RPC error toolgate answers a call with when the server's reply was over the limit.
/// In the implementation-defined server error range.
pub(super) const OVERSIZED_CODE: i32 = -32042;
const OVERSIZED_MESSAGE: &str = "toolgate: the MCP server's message was over its size limit";

pub(super) fn oversized_error(limit: usize) -> ErrorData {
    ErrorData::new(
        ErrorCode(OVERSIZED_CODE),
        OVERSIZED_MESSAGE,
        Some(serde_json::json!({ "limit": limit })),
    )
}

fn is_oversized(error: &ErrorData) -> bool {
    error.code.0 == OVERSIZED_CODE && error.message == OVERSIZED_MESSAGE
}
