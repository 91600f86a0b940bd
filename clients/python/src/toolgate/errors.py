"""Exceptions: transport failures carry their gRPC code; tool refusals are results, not these.

`TransportError` (and its per-code subclasses) means the request itself failed: the sidecar is
down, the deadline passed, the identity was refused, the request was malformed. A tool-level
refusal (DENIED, APPROVAL_REQUIRED, TIMEOUT, ...) is a `ToolResult`; `ToolCallError` is raised
for one only when the caller asks (`check=True` or `ToolResult.raise_for_status()`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from toolgate.models import ToolResult


class ToolgateError(Exception):
    """Base of every exception this package raises."""


class TransportError(ToolgateError):
    """A gRPC call failed; `code` is the grpc.StatusCode, `details` the server's or stack's text."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method} failed: {code.name}: {details}")


class UnauthenticatedError(TransportError):
    """No identity, or one the sidecar refused (bad or expired token, missing tenant)."""


class PermissionDeniedError(TransportError):
    """The caller may not do this (e.g. decide an approval without `toolgate:approve`)."""


class InvalidArgumentError(TransportError):
    """The request was malformed (no call, too many calls, bad page token, ...)."""


class NotFoundError(TransportError):
    """The approval named does not exist in the caller's tenant."""


class FailedPreconditionError(TransportError):
    """The approval is no longer pending."""


class DeadlineExceededError(TransportError):
    """The call's deadline passed before an answer arrived."""


class UnavailableError(TransportError):
    """The sidecar could not be reached, or is shutting down."""


class CancelledError(TransportError):
    """The call was cancelled."""


_BY_CODE: dict[grpc.StatusCode, type[TransportError]] = {
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.CANCELLED: CancelledError,
}


def transport_error(method: str, error: grpc.RpcError) -> TransportError:
    """The typed exception for a failed RPC (sync or aio)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
    return _BY_CODE.get(code, TransportError)(method, code, details or "")


class ToolCallError(ToolgateError):
    """A tool call did not return OK, raised only on request (`check=True`, `raise_for_status`)."""

    def __init__(self, result: ToolResult):
        self.result = result
        super().__init__(
            f"{result.status.name} {result.error_type}: {result.error_message}"
            f" (call {result.call_id})"
        )
