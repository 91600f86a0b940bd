"""Typed, immutable views of toolgate.v1 messages, and their conversion from and to the stubs.

Everything a caller touches is a plain dataclass or enum from here; the generated protobuf
classes stay inside the client.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgate.v1 import toolgate_pb2 as pb


class ToolStatus(enum.IntEnum):
    """The outcome of one tool call (`toolgate.v1.ToolStatus`, prefix dropped)."""

    UNSPECIFIED = 0
    OK = 1
    ERROR = 2
    INVALID_ARGUMENTS = 3
    NOT_FOUND = 4
    DENIED = 5
    RATE_LIMITED = 6
    APPROVAL_REQUIRED = 7
    TIMEOUT = 8
    CANCELLED = 9
    STALE_CATALOG = 10
    UNAVAILABLE = 11

    @classmethod
    def _missing_(cls, value: object) -> ToolStatus:
        # A newer sidecar may send a status this client does not know yet.
        return cls.UNSPECIFIED


class RiskLevel(enum.IntEnum):
    """What a tool can change (`toolgate.v1.RiskLevel`)."""

    UNSPECIFIED = 0
    READ_ONLY = 1
    WRITE_DRAFT = 2
    WRITE_CONFIRMED = 3
    DESTRUCTIVE = 4

    @classmethod
    def _missing_(cls, value: object) -> RiskLevel:
        return cls.UNSPECIFIED


class ApprovalState(enum.IntEnum):
    """Where an approval is in its life (`toolgate.v1.ApprovalState`)."""

    UNSPECIFIED = 0
    PENDING = 1
    APPROVED = 2
    REJECTED = 3
    USED = 4
    EXPIRED = 5
    INVALIDATED = 6

    @classmethod
    def _missing_(cls, value: object) -> ApprovalState:
        return cls.UNSPECIFIED


class ApprovalDecision(enum.IntEnum):
    """An approver's answer (`toolgate.v1.ApprovalDecision`)."""

    APPROVE = 1
    REJECT = 2


# The proto enum each Python enum mirrors, with its value-name prefix; tests check they agree.
PROTO_ENUMS: dict[type[enum.IntEnum], tuple[Any, str]] = {
    ToolStatus: (pb.ToolStatus, "TOOL_STATUS_"),
    RiskLevel: (pb.RiskLevel, "RISK_LEVEL_"),
    ApprovalState: (pb.ApprovalState, "APPROVAL_STATE_"),
    ApprovalDecision: (pb.ApprovalDecision, "APPROVAL_DECISION_"),
}


@dataclass(frozen=True)
class ToolDefinition:
    """One tool as this caller's model should see it; bound arguments are not in the schema."""

    name: str
    version: str
    description: str
    input_schema: Mapping[str, Any]
    risk_level: RiskLevel
    required_scopes: tuple[str, ...] = ()
    timeout_ms: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    requires_approval: bool = False

    @classmethod
    def from_proto(cls, message: pb.ToolDefinition) -> ToolDefinition:
        try:
            schema = json.loads(message.input_schema_json) if message.input_schema_json else {}
        except ValueError:
            schema = {}
        return cls(
            name=message.name,
            version=message.version,
            description=message.description,
            input_schema=schema if isinstance(schema, dict) else {},
            risk_level=RiskLevel(message.risk_level),
            required_scopes=tuple(message.required_scopes),
            timeout_ms=message.timeout_ms,
            labels=dict(message.labels),
            requires_approval=message.requires_approval,
        )


@dataclass(frozen=True)
class ToolList:
    """What ListTools returned: the visible tools, sorted by name, and the catalog revision."""

    tools: tuple[ToolDefinition, ...]
    catalog_revision: str

    def __iter__(self) -> Iterator[ToolDefinition]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    def get(self, name: str) -> ToolDefinition | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    @classmethod
    def from_proto(cls, message: pb.ListToolsResponse) -> ToolList:
        return cls(
            tools=tuple(ToolDefinition.from_proto(tool) for tool in message.tools),
            catalog_revision=message.catalog_revision,
        )


@dataclass(frozen=True)
class ToolCall:
    """One call a model proposed.

    `arguments` is either a mapping (serialized as JSON) or the raw JSON text the model produced,
    passed on unchanged so the sidecar judges exactly what the model wrote.
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    call_id: str = ""
    version: str = ""
    idempotency_key: str = ""
    approval_id: str = ""

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))

    def to_proto(self) -> pb.ToolCall:
        return pb.ToolCall(
            call_id=self.call_id,
            name=self.name,
            arguments_json=self.arguments_json(),
            version=self.version,
            idempotency_key=self.idempotency_key,
            approval_id=self.approval_id,
        )


@dataclass(frozen=True)
class ToolResult:
    """The normalized outcome of one call. Refusals are results too: check `status` or `ok`."""

    call_id: str
    status: ToolStatus
    # Exactly what goes back to the model: the output on OK, `TOOL_ERROR: {...}` otherwise.
    model_text: str
    error_type: str = ""
    error_message: str = ""
    retryable: bool = False
    user_visible: bool = False
    tool_version: str = ""
    approval_id: str = ""
    retry_after_ms: int = 0
    duration_ms: int = 0
    refused_by: str = ""
    idempotent_replay: bool = False

    @property
    def ok(self) -> bool:
        return self.status is ToolStatus.OK

    def json(self) -> Any:
        """The output parsed as JSON (OK results of tools that return JSON)."""
        return json.loads(self.model_text)

    def raise_for_status(self) -> ToolResult:
        """Returns self when OK; raises ToolCallError otherwise (for callers who want exceptions)."""
        if not self.ok:
            from toolgate.errors import ToolCallError

            raise ToolCallError(self)
        return self

    @classmethod
    def from_proto(cls, message: pb.ToolResult) -> ToolResult:
        return cls(
            call_id=message.call_id,
            status=ToolStatus(message.status),
            model_text=message.model_text,
            error_type=message.error_type,
            error_message=message.error_message,
            retryable=message.retryable,
            user_visible=message.user_visible,
            tool_version=message.tool_version,
            approval_id=message.approval_id,
            retry_after_ms=message.retry_after_ms,
            duration_ms=message.duration_ms,
            refused_by=message.refused_by,
            idempotent_replay=message.idempotent_replay,
        )


@dataclass(frozen=True)
class Approval:
    """A request to run one risky call, bound to its exact arguments and caller."""

    approval_id: str
    tenant: str
    subject: str
    agent: str
    run_id: str
    tool: str
    tool_version: str
    arguments_sha256: str
    state: ApprovalState
    risk_level: RiskLevel
    created_at_unix_ms: int
    expires_at_unix_ms: int
    decided_by: str = ""
    reason: str = ""
    # Full canonical arguments: only from get_approval (list pages carry the preview).
    arguments_json: str = ""
    # At most 1 KiB of the canonical arguments, for a list view.
    arguments_preview: str = ""
    arguments_truncated: bool = False

    @classmethod
    def from_proto(cls, message: pb.Approval) -> Approval:
        return cls(
            approval_id=message.approval_id,
            tenant=message.tenant,
            subject=message.subject,
            agent=message.agent,
            run_id=message.run_id,
            tool=message.tool,
            tool_version=message.tool_version,
            arguments_sha256=message.arguments_sha256,
            state=ApprovalState(message.state),
            risk_level=RiskLevel(message.risk_level),
            created_at_unix_ms=message.created_at_unix_ms,
            expires_at_unix_ms=message.expires_at_unix_ms,
            decided_by=message.decided_by,
            reason=message.reason,
            arguments_json=message.arguments_json,
            arguments_preview=message.arguments_preview,
            arguments_truncated=message.arguments_truncated,
        )


@dataclass(frozen=True)
class ApprovalPage:
    """One page of ListApprovals; pass `next_page_token` on to get the next (blank: last page)."""

    approvals: tuple[Approval, ...]
    next_page_token: str

    def __iter__(self) -> Iterator[Approval]:
        return iter(self.approvals)

    def __len__(self) -> int:
        return len(self.approvals)

    @classmethod
    def from_proto(cls, message: pb.ListApprovalsResponse) -> ApprovalPage:
        return cls(
            approvals=tuple(Approval.from_proto(a) for a in message.approvals),
            next_page_token=message.next_page_token,
        )


def as_tool_call(call: ToolCall | str, arguments: Mapping[str, Any] | str | None) -> ToolCall:
    """`execute("echo", {...})` and `execute(ToolCall(...))` both end up as a ToolCall."""
    if isinstance(call, ToolCall):
        if arguments is not None:
            raise TypeError("pass the arguments inside the ToolCall, not next to it")
        return call
    return ToolCall(name=call, arguments={} if arguments is None else arguments)


def as_tool_calls(calls: Sequence[ToolCall]) -> list[pb.ToolCall]:
    return [call.to_proto() for call in calls]
