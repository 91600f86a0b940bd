//! What a call produced, in domain terms, and the `model_text` the runtime hands to the model:
//! made by the boundary, read by what records a call (metrics, spans) and by the doors.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::error::{Refusal, Status};

/// The result of one call through the boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutcome {
    pub call_id: String,
    pub tool: String,
    /// The resolved version; empty when resolution failed.
    pub tool_version: String,
    pub status: Status,
    /// Exactly what the runtime appends to the conversation: the tool's output on OK (the result
    /// carries it once), otherwise the `TOOL_ERROR: …` text.
    pub model_text: String,
    /// Why the call is not OK; `None` on OK.
    pub refusal: Option<Refusal>,
    /// The approval created (APPROVAL_REQUIRED) or redeemed (OK).
    pub approval_id: Option<String>,
    pub duration: Duration,
    pub idempotent_replay: bool,
}

impl CallOutcome {
    pub fn ok(call_id: String, tool: String, tool_version: String, output: String) -> Self {
        CallOutcome {
            model_text: output,
            call_id,
            tool,
            tool_version,
            status: Status::Ok,
            refusal: None,
            approval_id: None,
            duration: Duration::ZERO,
            idempotent_replay: false,
        }
    }

    pub fn refused(call_id: String, tool: String, tool_version: String, refusal: Refusal) -> Self {
        CallOutcome {
            model_text: tool_error_text(&refusal, &tool, &call_id),
            call_id,
            tool,
            tool_version,
            status: refusal.status(),
            approval_id: refusal.approval_id.clone(),
            refusal: Some(refusal),
            duration: Duration::ZERO,
            idempotent_replay: false,
        }
    }
}

/// `TOOL_ERROR: {"errorType":…,"error":…,"tool":…,"callId":…}` — compact JSON, keys in this order,
/// so agent runtimes that parse this convention keep working.
pub fn tool_error_text(refusal: &Refusal, tool: &str, call_id: &str) -> String {
    let mut body = Map::new();
    body.insert("errorType".into(), Value::from(refusal.reason.code()));
    body.insert("error".into(), Value::from(refusal.text_for_caller()));
    body.insert("tool".into(), Value::from(tool));
    body.insert("callId".into(), Value::from(call_id));
    format!("TOOL_ERROR: {}", Value::Object(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Reason, Stage};

    #[test]
    fn tool_error_text_is_byte_exact() {
        let refusal = Refusal::new(
            Stage::Scopes,
            Reason::ScopeMissing,
            "missing scope \"tickets:write\"",
        );
        assert_eq!(
            tool_error_text(&refusal, "create_ticket", "c1"),
            r#"TOOL_ERROR: {"errorType":"scope_missing","error":"missing scope \"tickets:write\"","tool":"create_ticket","callId":"c1"}"#
        );
    }
}
