//! Outcome kinds and the one table that maps them to a `ToolStatus`, an `error_type` code and
//! retryability. Everything else returns a typed [`Refusal`]; only this file decides how a reason
//! looks on the wire.

use std::{fmt, time::Duration};

/// The outcome status of a tool call; mirrors `toolgate.v1.ToolStatus` without the proto types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Ok,
    Error,
    InvalidArguments,
    NotFound,
    Denied,
    RateLimited,
    ApprovalRequired,
    Timeout,
    Cancelled,
    StaleCatalog,
    Unavailable,
}

impl Status {
    /// The name used in logs, metrics and audit events.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Error => "ERROR",
            Status::InvalidArguments => "INVALID_ARGUMENTS",
            Status::NotFound => "NOT_FOUND",
            Status::Denied => "DENIED",
            Status::RateLimited => "RATE_LIMITED",
            Status::ApprovalRequired => "APPROVAL_REQUIRED",
            Status::Timeout => "TIMEOUT",
            Status::Cancelled => "CANCELLED",
            Status::StaleCatalog => "STALE_CATALOG",
            Status::Unavailable => "UNAVAILABLE",
        }
    }
}

enum_with_all! {
/// The boundary stage that produced an outcome, in chain order (`ALL` is chain order too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Structure,
    Resolve,
    Access,
    Scopes,
    Schema,
    Bind,
    RateLimit,
    Approval,
    Idempotency,
    Execute,
    Result,
}
}

impl Stage {
    /// The stage's name as it appears in `refused_by`, spans and audit events.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Structure => "structure",
            Stage::Resolve => "resolve",
            Stage::Access => "access",
            Stage::Scopes => "scopes",
            Stage::Schema => "schema",
            Stage::Bind => "bind",
            Stage::RateLimit => "rate_limit",
            Stage::Approval => "approval",
            Stage::Idempotency => "idempotency",
            Stage::Execute => "execute",
            Stage::Result => "result",
        }
    }
}

impl Stage {
    /// The stage with this name (for results read back from the shared state).
    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.iter().copied().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

enum_with_all! {
/// Why a call did not return OK. Each reason has one stable `error_type` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    ToolNameMissing,
    ArgumentsNotJson,
    ArgumentsNotObject,
    ArgumentsTooLarge,
    ArgumentsTooDeep,
    IdentifierTooLong,
    IdentifierInvalid,
    ToolNotFound,
    VersionNotAvailable,
    StaleCatalog,
    TenantUnknown,
    DeniedByPolicy,
    EmergencyDenied,
    FlowDenied,
    HandoffNotAllowed,
    HandoffTooDeep,
    ConditionError,
    ScopeMissing,
    SchemaViolation,
    BoundArgumentOverride,
    RateLimited,
    CostOverBurst,
    RunBudgetExhausted,
    ApprovalRequired,
    ApprovalNotFound,
    ApprovalPending,
    ApprovalRejected,
    ApprovalExpired,
    ApprovalAlreadyUsed,
    ApprovalArgumentsChanged,
    ApprovalWrongCaller,
    ApprovalInvalidated,
    IdempotencyConflict,
    IdempotencyInProgress,
    Timeout,
    Cancelled,
    ToolFailed,
    UpstreamUnavailable,
    BackendMisconfigured,
    DestinationRefused,
    CredentialsUnavailable,
    CredentialsRefused,
    ToolUnavailable,
    DefinitionChanged,
    OutputTooLarge,
    OutputBlocked,
    Overloaded,
    AuditUnavailable,
    StateUnavailable,
    Internal,
}
}

/// One row of the outcome table.
struct Row {
    code: &'static str,
    status: Status,
    retryable: bool,
}

impl Reason {
    /// The table: every reason's `error_type`, status and default retryability, in one place.
    fn row(self) -> Row {
        use Reason::*;
        use Status as S;
        let (code, status, retryable) = match self {
            ToolNameMissing => ("tool_name_missing", S::InvalidArguments, false),
            ArgumentsNotJson => ("arguments_not_json", S::InvalidArguments, false),
            ArgumentsNotObject => ("arguments_not_object", S::InvalidArguments, false),
            ArgumentsTooLarge => ("arguments_too_large", S::InvalidArguments, false),
            ArgumentsTooDeep => ("arguments_too_deep", S::InvalidArguments, false),
            IdentifierTooLong => ("identifier_too_long", S::InvalidArguments, false),
            IdentifierInvalid => ("identifier_invalid", S::InvalidArguments, false),
            ToolNotFound => ("tool_not_found", S::NotFound, false),
            VersionNotAvailable => ("version_not_available", S::NotFound, false),
            StaleCatalog => ("stale_catalog", S::StaleCatalog, false),
            TenantUnknown => ("tenant_unknown", S::Denied, false),
            DeniedByPolicy => ("denied_by_policy", S::Denied, false),
            // An operator stopped the tool; it may be lifted, but not by retrying.
            EmergencyDenied => ("emergency_denied", S::Denied, false),
            // A flow rule: what the run (or caller) has seen forbids this tool now.
            FlowDenied => ("flow_denied", S::Denied, false),
            // A sub-agent's call of a tool outside what its handoff allowed.
            HandoffNotAllowed => ("handoff_not_allowed", S::Denied, false),
            // A handoff past the chain's depth limit.
            HandoffTooDeep => ("handoff_too_deep", S::Denied, false),
            // A condition that cannot be evaluated decides closed (docs/conditions.md).
            ConditionError => ("condition_error", S::Denied, false),
            ScopeMissing => ("scope_missing", S::Denied, false),
            SchemaViolation => ("schema_violation", S::InvalidArguments, false),
            BoundArgumentOverride => ("bound_argument_override", S::Denied, false),
            RateLimited => ("rate_limited", S::RateLimited, true),
            // More cells than the quota's burst: no wait admits it (docs/conditions.md).
            CostOverBurst => ("cost_over_burst", S::RateLimited, false),
            // A budget of the run (or the caller's day) is spent: no wait within it admits more.
            RunBudgetExhausted => ("run_budget_exhausted", S::Denied, false),
            ApprovalRequired => ("approval_required", S::ApprovalRequired, false),
            ApprovalNotFound => ("approval_not_found", S::Denied, false),
            ApprovalPending => ("approval_pending", S::Denied, true),
            ApprovalRejected => ("approval_rejected", S::Denied, false),
            ApprovalExpired => ("approval_expired", S::Denied, false),
            ApprovalAlreadyUsed => ("approval_already_used", S::Denied, false),
            ApprovalArgumentsChanged => ("approval_arguments_changed", S::Denied, false),
            ApprovalWrongCaller => ("approval_wrong_caller", S::Denied, false),
            ApprovalInvalidated => ("approval_invalidated", S::Denied, false),
            IdempotencyConflict => ("idempotency_conflict", S::InvalidArguments, false),
            IdempotencyInProgress => ("idempotency_in_progress", S::Unavailable, true),
            Timeout => ("timeout", S::Timeout, true),
            Cancelled => ("cancelled", S::Cancelled, false),
            ToolFailed => ("tool_failed", S::Error, false),
            UpstreamUnavailable => ("upstream_unavailable", S::Error, true),
            BackendMisconfigured => ("backend_misconfigured", S::Error, false),
            DestinationRefused => ("destination_refused", S::Denied, false),
            // No credential for the backend: its token endpoint failed (nothing was sent), or
            // refused this caller.
            CredentialsUnavailable => ("credentials_unavailable", S::Unavailable, true),
            CredentialsRefused => ("credentials_refused", S::Denied, false),
            ToolUnavailable => ("tool_unavailable", S::Unavailable, true),
            // A pinned MCP tool withdrawn: no retry helps until an operator acts.
            DefinitionChanged => ("definition_changed", S::Unavailable, false),
            OutputTooLarge => ("output_too_large", S::Error, false),
            OutputBlocked => ("output_blocked", S::Error, false),
            Overloaded => ("overloaded", S::Unavailable, true),
            AuditUnavailable => ("audit_unavailable", S::Unavailable, true),
            StateUnavailable => ("state_unavailable", S::Unavailable, true),
            Internal => ("internal", S::Error, false),
        };
        Row {
            code,
            status,
            retryable,
        }
    }

    /// The stable `error_type` code.
    pub fn code(self) -> &'static str {
        self.row().code
    }

    /// The reason with this code (for results read back from the shared state).
    pub fn from_code(code: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.code() == code)
    }

    /// The status this reason produces.
    pub fn status(self) -> Status {
        self.row().status
    }

    /// Whether a retry of the same call may succeed, unless the refusal says otherwise.
    pub fn retryable(self) -> bool {
        self.row().retryable
    }
}

/// A call that did not produce OK: which stage decided, why, and what the caller should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub stage: Stage,
    pub reason: Reason,
    /// Short, model-safe explanation in toolgate's words: no addresses, paths or stack traces,
    /// and no argument values. This is what audit events and spans record.
    pub message: String,
    /// Text the backend wrote itself (stderr, an error body's first line, an MCP error), bounded.
    /// It goes to the caller and the model after `message`, but may echo argument values.
    pub detail: Option<String>,
    /// `detail` as audit events and spans may carry it: only for tools that record their
    /// arguments, with the tool's `redact` values replaced. `None` otherwise.
    pub recorded_detail: Option<String>,
    pub retryable: bool,
    pub retry_after: Option<Duration>,
    pub approval_id: Option<String>,
}

impl Refusal {
    /// A refusal with the table's default retryability.
    pub fn new(stage: Stage, reason: Reason, message: impl Into<String>) -> Self {
        Refusal {
            stage,
            reason,
            message: message.into(),
            detail: None,
            recorded_detail: None,
            retryable: reason.retryable(),
            retry_after: None,
            approval_id: None,
        }
    }

    /// Overrides the table's retryability (e.g. a timed-out write is not safe to retry).
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub fn with_approval_id(mut self, approval_id: impl Into<String>) -> Self {
        self.approval_id = Some(approval_id.into());
        self
    }

    pub fn status(&self) -> Status {
        self.reason.status()
    }

    /// The explanation the caller and the model get: the message, then the backend's own words.
    pub fn text_for_caller(&self) -> std::borrow::Cow<'_, str> {
        match &self.detail {
            Some(detail) => format!("{}: {detail}", self.message).into(),
            None => self.message.as_str().into(),
        }
    }

    /// The explanation audit events and spans record: never the backend's words unless the tool
    /// records its arguments (then redacted).
    pub fn text_for_record(&self) -> std::borrow::Cow<'_, str> {
        match &self.recorded_detail {
            Some(detail) => format!("{}: {detail}", self.message).into(),
            None => self.message.as_str().into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} refused by {}: {}",
            self.reason.code(),
            self.stage,
            self.message
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_are_unique_lowercase_identifiers() {
        let mut seen = HashSet::new();
        for reason in Reason::ALL {
            let code = reason.code();
            assert!(seen.insert(code), "duplicate code {code}");
            assert!(
                code.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{code}"
            );
        }
    }

    /// `ALL` comes from the enum's own list of variants (`enum_with_all!`); what is read back
    /// from the shared state decodes to what was written, for every variant.
    #[test]
    fn every_reason_and_stage_reads_back_from_its_name() {
        assert_eq!(Reason::ALL.len(), 50);
        for &reason in Reason::ALL {
            assert_eq!(Reason::from_code(reason.code()), Some(reason));
        }
        assert_eq!(Stage::ALL.first(), Some(&Stage::Structure));
        assert_eq!(Stage::ALL.last(), Some(&Stage::Result));
        for &stage in Stage::ALL {
            assert_eq!(Stage::from_name(stage.as_str()), Some(stage));
        }
        for &level in crate::settings::RiskLevel::ALL {
            assert_eq!(
                crate::settings::RiskLevel::parse(level.as_str()),
                Some(level)
            );
        }
        assert_eq!(crate::settings::RiskLevel::ALL.len(), 4);
    }

    #[test]
    fn only_transient_reasons_are_retryable() {
        let retryable: Vec<_> = Reason::ALL
            .iter()
            .filter(|r| r.retryable())
            .map(|r| r.code())
            .collect();
        assert_eq!(
            retryable,
            [
                "rate_limited",
                "approval_pending",
                "idempotency_in_progress",
                "timeout",
                "upstream_unavailable",
                "credentials_unavailable",
                "tool_unavailable",
                "overloaded",
                "audit_unavailable",
                "state_unavailable"
            ]
        );
    }
}
