//! What a tool call's span says of it, by the OpenTelemetry GenAI conventions for tool
//! execution: who called, what the chain resolved and how the call ended. The span itself is
//! started by telemetry (`execute_tool`); the attributes are listed in docs/observability.md.

use std::sync::Arc;

use opentelemetry::trace::Status as OtelStatus;

use crate::{
    catalog::ToolVersion,
    credentials::CredentialUsed,
    error::Status,
    identity::{Caller, Door},
    outcome::CallOutcome,
    telemetry::spans::ToolgateSpan,
};

/// A tool call's id and tool name as its audit event records them (cut to the identifier
/// limit), shared with its span rather than copied.
pub struct CallNames<'a> {
    pub call_id: &'a Arc<str>,
    pub tool: &'a Arc<str>,
}

/// The tool call's attributes and status, when it has ended: who called, what the chain
/// resolved (`tool`, when it did), and the outcome.
pub fn record_call(
    span: &mut ToolgateSpan,
    caller: &Caller,
    door: Door,
    names: CallNames<'_>,
    tool: Option<&ToolVersion>,
    credential: Option<&CredentialUsed>,
    outcome: &CallOutcome,
) {
    if !span.is_recording() {
        return;
    }
    // Who the backend was called as: never the token, its fingerprint.
    if let Some(credential) = credential {
        span.set("toolgate.credential.kind", credential.kind);
        span.set(
            "toolgate.credential.fingerprint",
            credential.fingerprint.clone(),
        );
        for (key, value) in [
            ("toolgate.credential.subject", &credential.subject),
            ("toolgate.credential.actor", &credential.actor),
            ("toolgate.credential.audience", &credential.audience),
        ] {
            if let Some(value) = value {
                span.set(key, value.clone());
            }
        }
    }
    span.set("gen_ai.operation.name", "execute_tool");
    span.set("gen_ai.tool.name", names.tool.clone());
    span.set("gen_ai.tool.call.id", names.call_id.clone());
    span.set("toolgate.tenant", caller.tenant.clone());
    span.set("toolgate.agent", caller.agent.clone());
    span.set("toolgate.door", door.as_str());
    if let Some(delegation) = caller.delegation.as_deref() {
        span.set("toolgate.delegation.depth", i64::from(delegation.depth));
        span.set("toolgate.delegation.agents", delegation.chain.join(","));
        span.set(
            "toolgate.delegation.parent_call_id",
            delegation.parent_call.clone(),
        );
        span.set("toolgate.delegation.run_id", delegation.run.clone());
    }
    if let Some(tool) = tool {
        span.set("toolgate.tool.version", tool.version.clone());
        span.set("toolgate.risk_level", tool.risk_level.as_str());
        span.set("toolgate.executor", tool.backend.kind());
        span.set("gen_ai.tool.type", gen_ai_tool_type(tool));
    }
    span.set("toolgate.status", outcome.status.as_str());
    span.set("toolgate.idempotent_replay", outcome.idempotent_replay);
    match &outcome.refusal {
        None => span.set_status(OtelStatus::Ok),
        Some(refusal) => {
            let reason = refusal.text_for_record().into_owned();
            span.set("error.type", refusal.reason.code());
            span.set("toolgate.refused_by", refusal.stage.as_str());
            span.set("toolgate.reason", reason.clone());
            span.set_status(OtelStatus::error(reason));
        }
    }
}

/// The GenAI convention's tool types: code run where the agent runs ("function"), or a service
/// reached over the network ("extension").
fn gen_ai_tool_type(tool: &ToolVersion) -> &'static str {
    match tool.backend.kind() {
        "http" | "mcp" => "extension",
        _ => "function",
    }
}

/// Arguments and result are recorded only for tools that opt in (`trace_content: true`).
pub fn record_content(
    span: &mut ToolgateSpan,
    arguments: &serde_json::Value,
    outcome: &CallOutcome,
) {
    if !span.is_recording() {
        return;
    }
    span.set("gen_ai.tool.call.arguments", arguments.to_string());
    if outcome.status == Status::Ok {
        span.set("gen_ai.tool.call.result", outcome.model_text.clone());
    }
}
