"""toolgate: the Python client of the toolgate sidecar.

    from toolgate import Client, DevIdentity
    with Client("127.0.0.1:50051", identity=DevIdentity(tenant="acme")) as client:
        result = client.execute("echo", {"text": "hi"})
        print(result.status.name, result.model_text)

Adapters: `toolgate.langchain` (LangChain tools) and `toolgate.openai_agents` (OpenAI Agents SDK
function tools), each behind an optional extra.
"""

from toolgate.client import DEFAULT_TARGET, DEFAULT_TIMEOUT, AsyncClient, Client, PageLimitError
from toolgate.errors import (
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ToolCallError,
    ToolgateError,
    TransportError,
    UnauthenticatedError,
    UnavailableError,
)
from toolgate.identity import BearerToken, DevIdentity, Identity, TokenProvider
from toolgate.models import (
    Approval,
    ApprovalDecision,
    ApprovalPage,
    ApprovalState,
    RiskLevel,
    ToolCall,
    ToolDefinition,
    ToolList,
    ToolResult,
    ToolStatus,
)
from toolgate.retry import RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TARGET",
    "DEFAULT_TIMEOUT",
    "Approval",
    "ApprovalDecision",
    "ApprovalPage",
    "ApprovalState",
    "AsyncClient",
    "BearerToken",
    "CancelledError",
    "Client",
    "DeadlineExceededError",
    "DevIdentity",
    "FailedPreconditionError",
    "Identity",
    "InvalidArgumentError",
    "NotFoundError",
    "PageLimitError",
    "PermissionDeniedError",
    "RetryPolicy",
    "RiskLevel",
    "TokenProvider",
    "ToolCall",
    "ToolCallError",
    "ToolDefinition",
    "ToolList",
    "ToolResult",
    "ToolStatus",
    "ToolgateError",
    "TransportError",
    "UnauthenticatedError",
    "UnavailableError",
]
