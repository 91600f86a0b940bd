//! Proto <-> domain conversion, and the gRPC status for the few request-level errors. Tool-level
//! outcomes never become gRPC errors: they are `ToolResult`s.

use std::time::Duration;

use tonic::{Code, Status as GrpcStatus};

use crate::{
    approvals::{Approval, ApprovalState, DecideError},
    boundary::{CallRequest, explain::ExplainError},
    catalog::ToolVersion,
    error::Status,
    outcome::CallOutcome,
    proto,
    settings::RiskLevel,
};

pub fn tool_status(status: Status) -> proto::ToolStatus {
    use proto::ToolStatus as P;
    match status {
        Status::Ok => P::Ok,
        Status::Error => P::Error,
        Status::InvalidArguments => P::InvalidArguments,
        Status::NotFound => P::NotFound,
        Status::Denied => P::Denied,
        Status::RateLimited => P::RateLimited,
        Status::ApprovalRequired => P::ApprovalRequired,
        Status::Timeout => P::Timeout,
        Status::Cancelled => P::Cancelled,
        Status::StaleCatalog => P::StaleCatalog,
        Status::Unavailable => P::Unavailable,
    }
}

pub fn risk_level(risk: RiskLevel) -> proto::RiskLevel {
    match risk {
        RiskLevel::ReadOnly => proto::RiskLevel::ReadOnly,
        RiskLevel::WriteDraft => proto::RiskLevel::WriteDraft,
        RiskLevel::WriteConfirmed => proto::RiskLevel::WriteConfirmed,
        RiskLevel::Destructive => proto::RiskLevel::Destructive,
    }
}

pub fn tool_definition(tool: &ToolVersion) -> proto::ToolDefinition {
    proto::ToolDefinition {
        name: tool.name.clone(),
        version: tool.version.to_string(),
        description: tool.description.clone(),
        input_schema_json: tool.visible_schema_json.clone(),
        risk_level: risk_level(tool.risk_level) as i32,
        required_scopes: tool.required_scopes.clone(),
        timeout_ms: u32::try_from(tool.timeout.as_millis()).unwrap_or(u32::MAX),
        labels: tool.labels.clone().into_iter().collect(),
        requires_approval: tool.requires_approval,
    }
}

fn non_empty(text: String) -> Option<String> {
    Some(text).filter(|t| !t.trim().is_empty())
}

pub fn call_request(call: proto::ToolCall) -> CallRequest {
    CallRequest {
        call_id: call.call_id,
        name: call.name,
        arguments_json: call.arguments_json,
        version: non_empty(call.version),
        idempotency_key: non_empty(call.idempotency_key),
        approval_id: non_empty(call.approval_id),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

pub fn tool_result(outcome: CallOutcome) -> proto::ToolResult {
    let refusal = outcome.refusal.as_ref();
    proto::ToolResult {
        call_id: outcome.call_id,
        status: tool_status(outcome.status) as i32,
        #[expect(
            deprecated,
            reason = "always empty: the output travels once, as model_text"
        )]
        output: String::new(),
        model_text: outcome.model_text,
        error_type: refusal
            .map(|r| r.reason.code().to_owned())
            .unwrap_or_default(),
        error_message: refusal
            .map(|r| r.text_for_caller().into_owned())
            .unwrap_or_default(),
        retryable: refusal.is_some_and(|r| r.retryable),
        // Refusal messages are written to be shown: no addresses, paths or internals.
        user_visible: refusal.is_some(),
        tool_version: outcome.tool_version,
        approval_id: outcome.approval_id.unwrap_or_default(),
        retry_after_ms: refusal.and_then(|r| r.retry_after).map(millis).unwrap_or(0),
        duration_ms: millis(outcome.duration),
        refused_by: refusal
            .map(|r| r.stage.as_str().to_owned())
            .unwrap_or_default(),
        idempotent_replay: outcome.idempotent_replay,
    }
}

pub fn approval_state(state: ApprovalState) -> proto::ApprovalState {
    use proto::ApprovalState as P;
    match state {
        ApprovalState::Pending => P::Pending,
        ApprovalState::Approved => P::Approved,
        ApprovalState::Rejected => P::Rejected,
        ApprovalState::Used => P::Used,
        ApprovalState::Expired => P::Expired,
        ApprovalState::Invalidated => P::Invalidated,
    }
}

pub fn approval_state_filter(raw: i32) -> Result<Option<ApprovalState>, GrpcStatus> {
    use proto::ApprovalState as P;
    match P::try_from(raw) {
        Ok(P::Unspecified) => Ok(None),
        Ok(P::Pending) => Ok(Some(ApprovalState::Pending)),
        Ok(P::Approved) => Ok(Some(ApprovalState::Approved)),
        Ok(P::Rejected) => Ok(Some(ApprovalState::Rejected)),
        Ok(P::Used) => Ok(Some(ApprovalState::Used)),
        Ok(P::Expired) => Ok(Some(ApprovalState::Expired)),
        Ok(P::Invalidated) => Ok(Some(ApprovalState::Invalidated)),
        Err(_) => Err(GrpcStatus::invalid_argument(format!(
            "unknown approval state {raw}"
        ))),
    }
}

/// Most bytes of an approval's arguments shown in a listing.
pub const ARGUMENTS_PREVIEW_BYTES: usize = 1024;

/// An approval as listed: a bounded preview of its arguments, not the arguments themselves, so a
/// page stays small whatever the calls sent.
pub fn approval_summary(a: Approval) -> proto::Approval {
    let preview = crate::boundary::truncate_utf8(&a.arguments_json, ARGUMENTS_PREVIEW_BYTES);
    let truncated = preview.len() < a.arguments_json.len();
    let preview = preview.to_owned();
    let mut summary = approval(Approval {
        arguments_json: String::new(),
        ..a
    });
    summary.arguments_preview = preview;
    summary.arguments_truncated = truncated;
    summary
}

/// An approval with its full arguments (and their preview).
pub fn approval(a: Approval) -> proto::Approval {
    let preview = crate::boundary::truncate_utf8(&a.arguments_json, ARGUMENTS_PREVIEW_BYTES);
    let arguments_truncated = preview.len() < a.arguments_json.len();
    let arguments_preview = preview.to_owned();
    proto::Approval {
        arguments_preview,
        arguments_truncated,
        approval_id: a.id,
        tenant: a.binding.tenant,
        subject: a.binding.subject,
        agent: a.binding.agent,
        run_id: a.binding.run_id,
        tool: a.binding.tool,
        tool_version: a.binding.tool_version,
        arguments_sha256: a.binding.arguments_sha256,
        arguments_json: a.arguments_json,
        state: approval_state(a.state) as i32,
        created_at_unix_ms: a.created_at_ms,
        expires_at_unix_ms: a.expires_at_ms,
        decided_by: a.decided_by,
        decided_at_unix_ms: a.decided_at_ms,
        reason: a.reason,
        risk_level: risk_level(a.risk_level) as i32,
        needed_because: a.needed_because,
    }
}

pub fn decision(raw: i32) -> Option<bool> {
    match proto::ApprovalDecision::try_from(raw) {
        Ok(proto::ApprovalDecision::Approve) => Some(true),
        Ok(proto::ApprovalDecision::Reject) => Some(false),
        _ => None,
    }
}

/// The gRPC code of each request-level error: explain and the approvals admin, here together
/// (call outcomes are `crate::error`'s table; a caller admission refuses, `crate::admission`'s).
pub fn explain_status(err: &ExplainError) -> GrpcStatus {
    let code = match err {
        ExplainError::MissingScope => Code::PermissionDenied,
    };
    GrpcStatus::new(code, err.to_string())
}

pub fn decide_status(err: &DecideError) -> GrpcStatus {
    let code = match err {
        DecideError::MissingScope | DecideError::SelfApproval => Code::PermissionDenied,
        DecideError::NotFound(_) => Code::NotFound,
        DecideError::NotPending { .. } => Code::FailedPrecondition,
        DecideError::NoDecision | DecideError::InvalidPageToken | DecideError::InvalidReason(_) => {
            Code::InvalidArgument
        }
        DecideError::AuditUnavailable | DecideError::Unavailable(_) => Code::Unavailable,
    };
    GrpcStatus::new(code, err.to_string())
}

/// A SetEmergencyDeny request in domain terms: blank tenant and agent mean every one.
pub fn new_deny(request: proto::SetEmergencyDenyRequest) -> crate::emergency::NewDeny {
    let given = |text: String| Some(text).filter(|t| !t.is_empty());
    crate::emergency::NewDeny {
        tools: request.tools,
        tenant: given(request.tenant),
        agent: given(request.agent),
        reason: request.reason,
        ttl: (request.ttl_seconds > 0).then(|| Duration::from_secs(u64::from(request.ttl_seconds))),
        cancel_running: request.cancel_running,
    }
}

pub fn emergency_deny(deny: crate::emergency::EmergencyDeny) -> proto::EmergencyDeny {
    proto::EmergencyDeny {
        deny_id: deny.id,
        tools: deny.tools,
        tenant: deny.tenant.unwrap_or_default(),
        agent: deny.agent.unwrap_or_default(),
        reason: deny.reason,
        set_by: deny.set_by,
        set_at_unix_ms: deny.set_at_ms,
        expires_at_unix_ms: deny.expires_at_ms.unwrap_or(0),
        cancel_running: deny.cancel_running,
    }
}

pub fn deny_status(err: &crate::emergency::DenyError) -> GrpcStatus {
    use crate::emergency::DenyError as E;
    let code = match err {
        E::MissingScope | E::OtherTenant { .. } | E::SetByPlatform(_) => Code::PermissionDenied,
        E::InvalidTools(..) | E::ReasonMissing | E::TooLong(..) | E::Blank(_) | E::TtlTooLong => {
            Code::InvalidArgument
        }
        E::TooMany | E::TooManyForTenant => Code::ResourceExhausted,
        E::NotFound(_) => Code::NotFound,
        E::Unavailable(_) | E::AuditUnavailable => Code::Unavailable,
    };
    GrpcStatus::new(code, err.to_string())
}

/// Parses the `grpc-timeout` header (e.g. `500m`, `2S`) as the gRPC spec writes it: 1 to 8 ASCII
/// digits and a unit. Anything else is not a timeout (the call then has no client deadline).
pub fn grpc_timeout(value: &str) -> Option<Duration> {
    // Bytes, not characters: a multi-byte last character must not be split (found by fuzzing).
    let (unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let digits = std::str::from_utf8(digits).ok()?;
    let unit = std::str::from_utf8(std::slice::from_ref(unit)).ok()?;
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(grpc_timeout("500m"), Some(Duration::from_millis(500)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("x"), None);
        assert_eq!(grpc_timeout(""), None);
        assert_eq!(
            grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        for bad in [
            "18446744073709551615S",
            "123456789m",
            "+5S",
            "-5S",
            "5 S",
            "S",
            "5s",
        ] {
            assert_eq!(grpc_timeout(bad), None, "{bad}");
        }
    }
}
