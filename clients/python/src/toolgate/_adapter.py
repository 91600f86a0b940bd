"""What the framework adapters share: tool names a model API accepts, and approval memory.

Approval memory: when a call comes back APPROVAL_REQUIRED, the adapter remembers its approval_id
under (run, tool, canonical arguments). When the model proposes the same call again in the same run
(after a person approved it), the adapter sends that approval_id with it, so the approval round
trip needs nothing from the model but repeating itself. The model never sees or sends approval ids
as arguments.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from toolgate.models import ToolDefinition, ToolResult, ToolStatus

# What OpenAI-style function names may contain; toolgate names may also have dots (MCP tools).
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64


def model_tool_names(tools: Iterable[ToolDefinition]) -> dict[str, ToolDefinition]:
    """Maps the name shown to the model to each tool (dots and other characters become `_`)."""
    names: dict[str, ToolDefinition] = {}
    for tool in tools:
        name = _NAME_OK.sub("_", tool.name)[:_MAX_NAME]
        if name in names:
            raise ValueError(f"tools {names[name].name!r} and {tool.name!r} both map to the model name {name!r}")
        names[name] = tool
    return names


def parse_arguments(arguments: Mapping[str, Any] | str) -> Any:
    """The arguments as JSON values, or the raw text when it is not JSON (the sidecar refuses it)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return dict(arguments)


class ApprovalMemory:
    """Approval ids handed out in this toolset, by (run, tool, canonical arguments). Bounded."""

    def __init__(self, max_entries: int = 256):
        self._entries: OrderedDict[str, str] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    @staticmethod
    def key(run_id: str, tool: str, arguments: Any) -> str:
        canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return json.dumps([run_id, tool, canonical])

    def approval_for(self, key: str) -> str:
        with self._lock:
            return self._entries.get(key, "")

    def record(self, key: str, result: ToolResult) -> None:
        with self._lock:
            if result.status is ToolStatus.APPROVAL_REQUIRED and result.approval_id:
                self._entries[key] = result.approval_id
                self._entries.move_to_end(key)
                while len(self._entries) > self._max:
                    self._entries.popitem(last=False)
            elif result.error_type != "approval_pending":
                # Used (OK) or refused for good; a pending one stays for the next repeat.
                self._entries.pop(key, None)


def result_summary(result: ToolResult) -> dict[str, Any]:
    """The result's fields as plain JSON values, for a framework's artifact or metadata slot."""
    return {
        "call_id": result.call_id,
        "status": result.status.name,
        "error_type": result.error_type,
        "refused_by": result.refused_by,
        "retryable": result.retryable,
        "retry_after_ms": result.retry_after_ms,
        "approval_id": result.approval_id,
        "tool_version": result.tool_version,
        "duration_ms": result.duration_ms,
    }
