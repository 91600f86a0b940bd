from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RiskLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RISK_LEVEL_UNSPECIFIED: _ClassVar[RiskLevel]
    RISK_LEVEL_READ_ONLY: _ClassVar[RiskLevel]
    RISK_LEVEL_WRITE_DRAFT: _ClassVar[RiskLevel]
    RISK_LEVEL_WRITE_CONFIRMED: _ClassVar[RiskLevel]
    RISK_LEVEL_DESTRUCTIVE: _ClassVar[RiskLevel]

class ToolStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_STATUS_UNSPECIFIED: _ClassVar[ToolStatus]
    TOOL_STATUS_OK: _ClassVar[ToolStatus]
    TOOL_STATUS_ERROR: _ClassVar[ToolStatus]
    TOOL_STATUS_INVALID_ARGUMENTS: _ClassVar[ToolStatus]
    TOOL_STATUS_NOT_FOUND: _ClassVar[ToolStatus]
    TOOL_STATUS_DENIED: _ClassVar[ToolStatus]
    TOOL_STATUS_RATE_LIMITED: _ClassVar[ToolStatus]
    TOOL_STATUS_APPROVAL_REQUIRED: _ClassVar[ToolStatus]
    TOOL_STATUS_TIMEOUT: _ClassVar[ToolStatus]
    TOOL_STATUS_CANCELLED: _ClassVar[ToolStatus]
    TOOL_STATUS_STALE_CATALOG: _ClassVar[ToolStatus]
    TOOL_STATUS_UNAVAILABLE: _ClassVar[ToolStatus]

class StageResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_RESULT_UNSPECIFIED: _ClassVar[StageResult]
    STAGE_RESULT_PASSED: _ClassVar[StageResult]
    STAGE_RESULT_REFUSED: _ClassVar[StageResult]
    STAGE_RESULT_NOT_REACHED: _ClassVar[StageResult]
    STAGE_RESULT_NOT_APPLICABLE: _ClassVar[StageResult]

class ApprovalState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATE_UNSPECIFIED: _ClassVar[ApprovalState]
    APPROVAL_STATE_PENDING: _ClassVar[ApprovalState]
    APPROVAL_STATE_APPROVED: _ClassVar[ApprovalState]
    APPROVAL_STATE_REJECTED: _ClassVar[ApprovalState]
    APPROVAL_STATE_USED: _ClassVar[ApprovalState]
    APPROVAL_STATE_EXPIRED: _ClassVar[ApprovalState]
    APPROVAL_STATE_INVALIDATED: _ClassVar[ApprovalState]

class ApprovalDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_DECISION_UNSPECIFIED: _ClassVar[ApprovalDecision]
    APPROVAL_DECISION_APPROVE: _ClassVar[ApprovalDecision]
    APPROVAL_DECISION_REJECT: _ClassVar[ApprovalDecision]
RISK_LEVEL_UNSPECIFIED: RiskLevel
RISK_LEVEL_READ_ONLY: RiskLevel
RISK_LEVEL_WRITE_DRAFT: RiskLevel
RISK_LEVEL_WRITE_CONFIRMED: RiskLevel
RISK_LEVEL_DESTRUCTIVE: RiskLevel
TOOL_STATUS_UNSPECIFIED: ToolStatus
TOOL_STATUS_OK: ToolStatus
TOOL_STATUS_ERROR: ToolStatus
TOOL_STATUS_INVALID_ARGUMENTS: ToolStatus
TOOL_STATUS_NOT_FOUND: ToolStatus
TOOL_STATUS_DENIED: ToolStatus
TOOL_STATUS_RATE_LIMITED: ToolStatus
TOOL_STATUS_APPROVAL_REQUIRED: ToolStatus
TOOL_STATUS_TIMEOUT: ToolStatus
TOOL_STATUS_CANCELLED: ToolStatus
TOOL_STATUS_STALE_CATALOG: ToolStatus
TOOL_STATUS_UNAVAILABLE: ToolStatus
STAGE_RESULT_UNSPECIFIED: StageResult
STAGE_RESULT_PASSED: StageResult
STAGE_RESULT_REFUSED: StageResult
STAGE_RESULT_NOT_REACHED: StageResult
STAGE_RESULT_NOT_APPLICABLE: StageResult
APPROVAL_STATE_UNSPECIFIED: ApprovalState
APPROVAL_STATE_PENDING: ApprovalState
APPROVAL_STATE_APPROVED: ApprovalState
APPROVAL_STATE_REJECTED: ApprovalState
APPROVAL_STATE_USED: ApprovalState
APPROVAL_STATE_EXPIRED: ApprovalState
APPROVAL_STATE_INVALIDATED: ApprovalState
APPROVAL_DECISION_UNSPECIFIED: ApprovalDecision
APPROVAL_DECISION_APPROVE: ApprovalDecision
APPROVAL_DECISION_REJECT: ApprovalDecision

class ToolDefinition(_message.Message):
    __slots__ = ("name", "version", "description", "input_schema_json", "risk_level", "required_scopes", "timeout_ms", "labels", "requires_approval")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    RISK_LEVEL_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_SCOPES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    description: str
    input_schema_json: str
    risk_level: RiskLevel
    required_scopes: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    labels: _containers.ScalarMap[str, str]
    requires_approval: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., risk_level: _Optional[_Union[RiskLevel, str]] = ..., required_scopes: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., requires_approval: _Optional[bool] = ...) -> None: ...

class ListToolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListToolsResponse(_message.Message):
    __slots__ = ("tools", "catalog_revision")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    CATALOG_REVISION_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolDefinition]
    catalog_revision: str
    def __init__(self, tools: _Optional[_Iterable[_Union[ToolDefinition, _Mapping]]] = ..., catalog_revision: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("call_id", "name", "arguments_json", "version", "idempotency_key", "approval_id")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    arguments_json: str
    version: str
    idempotency_key: str
    approval_id: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., version: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., approval_id: _Optional[str] = ...) -> None: ...

class ExecuteToolRequest(_message.Message):
    __slots__ = ("call", "run_id", "step", "catalog_revision")
    CALL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CATALOG_REVISION_FIELD_NUMBER: _ClassVar[int]
    call: ToolCall
    run_id: str
    step: int
    catalog_revision: str
    def __init__(self, call: _Optional[_Union[ToolCall, _Mapping]] = ..., run_id: _Optional[str] = ..., step: _Optional[int] = ..., catalog_revision: _Optional[str] = ...) -> None: ...

class ExecuteToolResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: ToolResult
    def __init__(self, result: _Optional[_Union[ToolResult, _Mapping]] = ...) -> None: ...

class ExecuteToolsRequest(_message.Message):
    __slots__ = ("calls", "run_id", "step", "parallel", "max_parallel", "catalog_revision")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    MAX_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    CATALOG_REVISION_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    run_id: str
    step: int
    parallel: bool
    max_parallel: int
    catalog_revision: str
    def __init__(self, calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., run_id: _Optional[str] = ..., step: _Optional[int] = ..., parallel: _Optional[bool] = ..., max_parallel: _Optional[int] = ..., catalog_revision: _Optional[str] = ...) -> None: ...

class ExecuteToolsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("call_id", "status", "output", "model_text", "error_type", "error_message", "retryable", "user_visible", "tool_version", "approval_id", "retry_after_ms", "duration_ms", "refused_by", "idempotent_replay")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_TEXT_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    USER_VISIBLE_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_REPLAY_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    status: ToolStatus
    output: str
    model_text: str
    error_type: str
    error_message: str
    retryable: bool
    user_visible: bool
    tool_version: str
    approval_id: str
    retry_after_ms: int
    duration_ms: int
    refused_by: str
    idempotent_replay: bool
    def __init__(self, call_id: _Optional[str] = ..., status: _Optional[_Union[ToolStatus, str]] = ..., output: _Optional[str] = ..., model_text: _Optional[str] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ..., retryable: _Optional[bool] = ..., user_visible: _Optional[bool] = ..., tool_version: _Optional[str] = ..., approval_id: _Optional[str] = ..., retry_after_ms: _Optional[int] = ..., duration_ms: _Optional[int] = ..., refused_by: _Optional[str] = ..., idempotent_replay: _Optional[bool] = ...) -> None: ...

class ExplainToolRequest(_message.Message):
    __slots__ = ("call", "run_id", "step", "catalog_revision")
    CALL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CATALOG_REVISION_FIELD_NUMBER: _ClassVar[int]
    call: ToolCall
    run_id: str
    step: int
    catalog_revision: str
    def __init__(self, call: _Optional[_Union[ToolCall, _Mapping]] = ..., run_id: _Optional[str] = ..., step: _Optional[int] = ..., catalog_revision: _Optional[str] = ...) -> None: ...

class CatalogRule(_message.Message):
    __slots__ = ("location", "pattern", "effect")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    location: str
    pattern: str
    effect: str
    def __init__(self, location: _Optional[str] = ..., pattern: _Optional[str] = ..., effect: _Optional[str] = ...) -> None: ...

class BoundArgument(_message.Message):
    __slots__ = ("path", "value_json", "source")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    path: str
    value_json: str
    source: str
    def __init__(self, path: _Optional[str] = ..., value_json: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class QuotaExplanation(_message.Message):
    __slots__ = ("scope", "rate", "burst", "remaining", "tracked")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    TRACKED_FIELD_NUMBER: _ClassVar[int]
    scope: str
    rate: str
    burst: int
    remaining: int
    tracked: bool
    def __init__(self, scope: _Optional[str] = ..., rate: _Optional[str] = ..., burst: _Optional[int] = ..., remaining: _Optional[int] = ..., tracked: _Optional[bool] = ...) -> None: ...

class StageExplanation(_message.Message):
    __slots__ = ("stage", "result", "detail", "rules", "missing_scope", "schema_violations", "bound_arguments", "quotas")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    MISSING_SCOPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    BOUND_ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    result: StageResult
    detail: str
    rules: _containers.RepeatedCompositeFieldContainer[CatalogRule]
    missing_scope: str
    schema_violations: _containers.RepeatedScalarFieldContainer[str]
    bound_arguments: _containers.RepeatedCompositeFieldContainer[BoundArgument]
    quotas: _containers.RepeatedCompositeFieldContainer[QuotaExplanation]
    def __init__(self, stage: _Optional[str] = ..., result: _Optional[_Union[StageResult, str]] = ..., detail: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[CatalogRule, _Mapping]]] = ..., missing_scope: _Optional[str] = ..., schema_violations: _Optional[_Iterable[str]] = ..., bound_arguments: _Optional[_Iterable[_Union[BoundArgument, _Mapping]]] = ..., quotas: _Optional[_Iterable[_Union[QuotaExplanation, _Mapping]]] = ...) -> None: ...

class ExplainToolResponse(_message.Message):
    __slots__ = ("decision", "would_execute", "stages", "final_arguments_json", "arguments_sha256", "bound_override_attempts", "catalog_revision", "conditions", "flow")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    WOULD_EXECUTE_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    FINAL_ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    BOUND_OVERRIDE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CATALOG_REVISION_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    decision: ToolResult
    would_execute: bool
    stages: _containers.RepeatedCompositeFieldContainer[StageExplanation]
    final_arguments_json: str
    arguments_sha256: str
    bound_override_attempts: _containers.RepeatedScalarFieldContainer[str]
    catalog_revision: str
    conditions: _containers.RepeatedCompositeFieldContainer[ConditionEvaluation]
    flow: FlowExplanation
    def __init__(self, decision: _Optional[_Union[ToolResult, _Mapping]] = ..., would_execute: _Optional[bool] = ..., stages: _Optional[_Iterable[_Union[StageExplanation, _Mapping]]] = ..., final_arguments_json: _Optional[str] = ..., arguments_sha256: _Optional[str] = ..., bound_override_attempts: _Optional[_Iterable[str]] = ..., catalog_revision: _Optional[str] = ..., conditions: _Optional[_Iterable[_Union[ConditionEvaluation, _Mapping]]] = ..., flow: _Optional[_Union[FlowExplanation, _Mapping]] = ...) -> None: ...

class FlowExplanation(_message.Message):
    __slots__ = ("scope", "seen", "readable", "adds", "rule", "rule_location", "rule_action")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    READABLE_FIELD_NUMBER: _ClassVar[int]
    ADDS_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    RULE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    RULE_ACTION_FIELD_NUMBER: _ClassVar[int]
    scope: str
    seen: _containers.RepeatedCompositeFieldContainer[FlowLabel]
    readable: bool
    adds: _containers.RepeatedScalarFieldContainer[str]
    rule: str
    rule_location: str
    rule_action: str
    def __init__(self, scope: _Optional[str] = ..., seen: _Optional[_Iterable[_Union[FlowLabel, _Mapping]]] = ..., readable: _Optional[bool] = ..., adds: _Optional[_Iterable[str]] = ..., rule: _Optional[str] = ..., rule_location: _Optional[str] = ..., rule_action: _Optional[str] = ...) -> None: ...

class FlowLabel(_message.Message):
    __slots__ = ("label", "calls")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    label: str
    calls: _containers.RepeatedCompositeFieldContainer[FlowCall]
    def __init__(self, label: _Optional[str] = ..., calls: _Optional[_Iterable[_Union[FlowCall, _Mapping]]] = ...) -> None: ...

class FlowCall(_message.Message):
    __slots__ = ("call_id", "tool")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    tool: str
    def __init__(self, call_id: _Optional[str] = ..., tool: _Optional[str] = ...) -> None: ...

class ConditionEvaluation(_message.Message):
    __slots__ = ("location", "expression", "value", "error", "cost", "variables_json")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_JSON_FIELD_NUMBER: _ClassVar[int]
    location: str
    expression: str
    value: bool
    error: str
    cost: int
    variables_json: str
    def __init__(self, location: _Optional[str] = ..., expression: _Optional[str] = ..., value: _Optional[bool] = ..., error: _Optional[str] = ..., cost: _Optional[int] = ..., variables_json: _Optional[str] = ...) -> None: ...

class ExplainListToolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ToolVisibility(_message.Message):
    __slots__ = ("name", "version", "visible", "hidden_by", "error_type", "reason", "rule", "missing_scope")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_BY_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    MISSING_SCOPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    visible: bool
    hidden_by: str
    error_type: str
    reason: str
    rule: CatalogRule
    missing_scope: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., visible: _Optional[bool] = ..., hidden_by: _Optional[str] = ..., error_type: _Optional[str] = ..., reason: _Optional[str] = ..., rule: _Optional[_Union[CatalogRule, _Mapping]] = ..., missing_scope: _Optional[str] = ...) -> None: ...

class ExplainListToolsResponse(_message.Message):
    __slots__ = ("tools", "catalog_revision")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    CATALOG_REVISION_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolVisibility]
    catalog_revision: str
    def __init__(self, tools: _Optional[_Iterable[_Union[ToolVisibility, _Mapping]]] = ..., catalog_revision: _Optional[str] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("approval_id", "tenant", "subject", "agent", "run_id", "tool", "tool_version", "arguments_sha256", "arguments_json", "state", "created_at_unix_ms", "expires_at_unix_ms", "decided_by", "reason", "risk_level", "arguments_preview", "arguments_truncated", "needed_because", "decided_at_unix_ms")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RISK_LEVEL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_PREVIEW_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NEEDED_BECAUSE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    tenant: str
    subject: str
    agent: str
    run_id: str
    tool: str
    tool_version: str
    arguments_sha256: str
    arguments_json: str
    state: ApprovalState
    created_at_unix_ms: int
    expires_at_unix_ms: int
    decided_by: str
    reason: str
    risk_level: RiskLevel
    arguments_preview: str
    arguments_truncated: bool
    needed_because: str
    decided_at_unix_ms: int
    def __init__(self, approval_id: _Optional[str] = ..., tenant: _Optional[str] = ..., subject: _Optional[str] = ..., agent: _Optional[str] = ..., run_id: _Optional[str] = ..., tool: _Optional[str] = ..., tool_version: _Optional[str] = ..., arguments_sha256: _Optional[str] = ..., arguments_json: _Optional[str] = ..., state: _Optional[_Union[ApprovalState, str]] = ..., created_at_unix_ms: _Optional[int] = ..., expires_at_unix_ms: _Optional[int] = ..., decided_by: _Optional[str] = ..., reason: _Optional[str] = ..., risk_level: _Optional[_Union[RiskLevel, str]] = ..., arguments_preview: _Optional[str] = ..., arguments_truncated: _Optional[bool] = ..., needed_because: _Optional[str] = ..., decided_at_unix_ms: _Optional[int] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("state", "page_size", "page_token")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    state: ApprovalState
    page_size: int
    page_token: str
    def __init__(self, state: _Optional[_Union[ApprovalState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id",)
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    def __init__(self, approval_id: _Optional[str] = ...) -> None: ...

class GetApprovalResponse(_message.Message):
    __slots__ = ("approval",)
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    approval: Approval
    def __init__(self, approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "decision", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    decision: ApprovalDecision
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., decision: _Optional[_Union[ApprovalDecision, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class DecideApprovalResponse(_message.Message):
    __slots__ = ("approval",)
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    approval: Approval
    def __init__(self, approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class EmergencyDeny(_message.Message):
    __slots__ = ("deny_id", "tools", "tenant", "agent", "reason", "set_by", "set_at_unix_ms", "expires_at_unix_ms", "cancel_running")
    DENY_ID_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    SET_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_RUNNING_FIELD_NUMBER: _ClassVar[int]
    deny_id: str
    tools: str
    tenant: str
    agent: str
    reason: str
    set_by: str
    set_at_unix_ms: int
    expires_at_unix_ms: int
    cancel_running: bool
    def __init__(self, deny_id: _Optional[str] = ..., tools: _Optional[str] = ..., tenant: _Optional[str] = ..., agent: _Optional[str] = ..., reason: _Optional[str] = ..., set_by: _Optional[str] = ..., set_at_unix_ms: _Optional[int] = ..., expires_at_unix_ms: _Optional[int] = ..., cancel_running: _Optional[bool] = ...) -> None: ...

class SetEmergencyDenyRequest(_message.Message):
    __slots__ = ("tools", "tenant", "agent", "reason", "ttl_seconds", "cancel_running")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_RUNNING_FIELD_NUMBER: _ClassVar[int]
    tools: str
    tenant: str
    agent: str
    reason: str
    ttl_seconds: int
    cancel_running: bool
    def __init__(self, tools: _Optional[str] = ..., tenant: _Optional[str] = ..., agent: _Optional[str] = ..., reason: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., cancel_running: _Optional[bool] = ...) -> None: ...

class SetEmergencyDenyResponse(_message.Message):
    __slots__ = ("deny", "shared")
    DENY_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    deny: EmergencyDeny
    shared: bool
    def __init__(self, deny: _Optional[_Union[EmergencyDeny, _Mapping]] = ..., shared: _Optional[bool] = ...) -> None: ...

class ClearEmergencyDenyRequest(_message.Message):
    __slots__ = ("deny_id",)
    DENY_ID_FIELD_NUMBER: _ClassVar[int]
    deny_id: str
    def __init__(self, deny_id: _Optional[str] = ...) -> None: ...

class ClearEmergencyDenyResponse(_message.Message):
    __slots__ = ("deny", "shared")
    DENY_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    deny: EmergencyDeny
    shared: bool
    def __init__(self, deny: _Optional[_Union[EmergencyDeny, _Mapping]] = ..., shared: _Optional[bool] = ...) -> None: ...

class ListEmergencyDeniesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEmergencyDeniesResponse(_message.Message):
    __slots__ = ("denies", "shared")
    DENIES_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    denies: _containers.RepeatedCompositeFieldContainer[EmergencyDeny]
    shared: bool
    def __init__(self, denies: _Optional[_Iterable[_Union[EmergencyDeny, _Mapping]]] = ..., shared: _Optional[bool] = ...) -> None: ...
