"""The sync `Client` (grpcio) and the async `AsyncClient` (grpc.aio) for one toolgate sidecar.

Both have the same surface: list_tools, execute, execute_many, list_approvals / iter_approvals,
get_approval, decide (approve, reject). Every RPC has a deadline (`timeout`, seconds; the client's
default unless given). Transport failures raise `TransportError` subclasses with the gRPC code; a
tool's refusal is a `ToolResult` unless `check=True`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from toolgate.errors import (
    ToolgateError,
    TransportError,
    UnauthenticatedError,
    transport_error,
)
from toolgate.identity import Identity, Metadata, TokenProvider
from toolgate.models import (
    Approval,
    ApprovalDecision,
    ApprovalPage,
    ApprovalState,
    ToolCall,
    ToolList,
    ToolResult,
    as_tool_call,
    as_tool_calls,
)
from toolgate.retry import RetryPolicy
from toolgate.v1 import toolgate_pb2 as pb
from toolgate.v1 import toolgate_pb2_grpc as pb_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
# A sidecar that does not answer must not hang the agent.
DEFAULT_TIMEOUT = 10.0
# iter_approvals stops (with PageLimitError) after this many pages unless told otherwise.
DEFAULT_MAX_PAGES = 100


class PageLimitError(ToolgateError):
    """iter_approvals read `max_pages` pages and the sidecar still had more."""


class _Attempts:
    """One retry budget shared by transport retries and result retries of one call."""

    def __init__(self) -> None:
        self.made = 0


def _decision(decision: ApprovalDecision | str) -> ApprovalDecision:
    if isinstance(decision, ApprovalDecision):
        return decision
    try:
        return ApprovalDecision[decision.upper()]
    except KeyError:
        raise ValueError(f"decision must be 'approve' or 'reject', not {decision!r}") from None


def _execute_request(
    call: ToolCall, run_id: str, step: int, catalog_revision: str
) -> pb.ExecuteToolRequest:
    return pb.ExecuteToolRequest(
        call=call.to_proto(), run_id=run_id, step=step, catalog_revision=catalog_revision
    )


def _batch_request(
    calls: Sequence[ToolCall],
    run_id: str,
    step: int,
    parallel: bool,
    max_parallel: int,
    catalog_revision: str,
) -> pb.ExecuteToolsRequest:
    return pb.ExecuteToolsRequest(
        calls=as_tool_calls(calls),
        run_id=run_id,
        step=step,
        parallel=parallel,
        max_parallel=max_parallel,
        catalog_revision=catalog_revision,
    )


def _approvals_request(state: ApprovalState, page_size: int, page_token: str) -> pb.ListApprovalsRequest:
    if page_size < 0:
        raise ValueError("page_size must not be negative")
    return pb.ListApprovalsRequest(state=int(state), page_size=page_size, page_token=page_token)


def _retry_delay(policy: RetryPolicy | None, attempts: _Attempts, result: ToolResult) -> float | None:
    if policy is None or not result.retryable:
        return None
    return policy.wait_for(attempts.made, result.retry_after_ms)


def _transport_delay(
    policy: RetryPolicy | None, attempts: _Attempts, error: TransportError, safe: bool
) -> float | None:
    if policy is None or not safe or error.code not in policy.transport_codes:
        return None
    return policy.wait_for(attempts.made, 0)


def _channel_options(target: str) -> list[tuple[str, str]]:
    # grpcio sends a Unix target's percent-encoded path as the `:authority`, which is no host name
    # and which HTTP/2 servers (toolgate's among them) refuse; gRPC clients send `localhost`.
    if target.startswith(("unix:", "unix-abstract:")):
        return [("grpc.default_authority", "localhost")]
    return []


class _Common:
    def __init__(
        self,
        identity: Identity,
        timeout: float,
        retry: RetryPolicy | None,
        metadata: Mapping[str, str] | None,
    ):
        if identity is None:
            raise TypeError("identity is required: DevIdentity, BearerToken or TokenProvider")
        self._identity = identity
        self._timeout = self._check_timeout(timeout)
        self._retry = retry
        self._extra_metadata: Metadata = tuple((metadata or {}).items())

    @staticmethod
    def _check_timeout(timeout: float) -> float:
        if not timeout or timeout <= 0:
            raise ValueError("every call needs a positive deadline (timeout, in seconds)")
        return float(timeout)

    def _deadline(self, timeout: float | None) -> float:
        return self._timeout if timeout is None else self._check_timeout(timeout)

    def _policy(self, retry: RetryPolicy | None | bool) -> RetryPolicy | None:
        # retry=False turns off the client's default for one call.
        if retry is False:
            return None
        if retry is None or retry is True:
            return self._retry
        return retry


class Client(_Common):
    """A blocking client. Thread-safe; one per sidecar is enough. Use as a context manager."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        identity: Identity,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        metadata: Mapping[str, str] | None = None,
        channel: grpc.Channel | None = None,
    ):
        """`target` is host:port or `unix:///path/to.sock`; or pass your own `channel`."""
        super().__init__(identity, timeout, retry, metadata)
        self._owns_channel = channel is None
        self._channel = (
            channel if channel is not None else grpc.insecure_channel(target, options=_channel_options(target))
        )
        self._toolgate = pb_grpc.ToolGateStub(self._channel)
        self._approvals = pb_grpc.ApprovalsStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    # --- ToolGate ---------------------------------------------------------------------------

    def list_tools(self, *, timeout: float | None = None, retry: RetryPolicy | bool | None = None) -> ToolList:
        """The tools this caller's model may see, and the catalog revision it was shown."""
        response = self._unary(
            "ListTools", self._toolgate.ListTools, pb.ListToolsRequest(), timeout, True, self._policy(retry), _Attempts()
        )
        return ToolList.from_proto(response)

    def execute(
        self,
        call: ToolCall | str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        run_id: str = "",
        step: int = 0,
        catalog_revision: str = "",
        timeout: float | None = None,
        retry: RetryPolicy | bool | None = None,
        check: bool = False,
    ) -> ToolResult:
        """Runs one call: `execute("echo", {"text": "hi"})` or `execute(ToolCall(...))`.

        Returns the ToolResult whatever the tool's outcome; `check=True` raises ToolCallError for
        anything but OK.
        """
        call = as_tool_call(call, arguments)
        request = _execute_request(call, run_id, step, catalog_revision)
        policy, attempts = self._policy(retry), _Attempts()
        while True:
            response = self._unary(
                "ExecuteTool", self._toolgate.ExecuteTool, request, timeout, bool(call.idempotency_key), policy, attempts
            )
            result = ToolResult.from_proto(response.result)
            delay = _retry_delay(policy, attempts, result)
            if delay is None:
                return result.raise_for_status() if check else result
            policy.sleep(delay)  # type: ignore[union-attr]

    def execute_many(
        self,
        calls: Sequence[ToolCall],
        *,
        parallel: bool = False,
        max_parallel: int = 0,
        run_id: str = "",
        step: int = 0,
        catalog_revision: str = "",
        timeout: float | None = None,
        retry: RetryPolicy | bool | None = None,
        check: bool = False,
    ) -> list[ToolResult]:
        """Runs the calls of one model turn; results come back in the order of `calls`.

        With a retry policy only the retryable results are sent again (as a smaller batch).
        """
        results: list[ToolResult | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        policy, attempts = self._policy(retry), _Attempts()
        while pending:
            batch = [calls[i] for i in pending]
            request = _batch_request(batch, run_id, step, parallel, max_parallel, catalog_revision)
            safe = all(call.idempotency_key for call in batch)
            response = self._unary(
                "ExecuteTools", self._toolgate.ExecuteTools, request, timeout, safe, policy, attempts
            )
            for index, message in zip(pending, response.results):
                results[index] = ToolResult.from_proto(message)
            retry_now = [i for i in pending if results[i].retryable]  # type: ignore[union-attr]
            delays = [_retry_delay(policy, attempts, results[i]) for i in retry_now]  # type: ignore[arg-type]
            if not delays or any(d is None for d in delays):
                break
            policy.sleep(max(d for d in delays if d is not None))  # type: ignore[union-attr]
            pending = retry_now
        done = [r for r in results if r is not None]
        if check:
            for result in done:
                result.raise_for_status()
        return done

    # --- Approvals ----------------------------------------------------------------------------

    def list_approvals(
        self,
        *,
        state: ApprovalState = ApprovalState.PENDING,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
        retry: RetryPolicy | bool | None = None,
    ) -> ApprovalPage:
        """One page (oldest first) of the approvals of the caller's tenant, with argument previews."""
        request = _approvals_request(state, page_size, page_token)
        response = self._unary(
            "ListApprovals", self._approvals.ListApprovals, request, timeout, True, self._policy(retry), _Attempts()
        )
        return ApprovalPage.from_proto(response)

    def iter_approvals(
        self,
        *,
        state: ApprovalState = ApprovalState.PENDING,
        page_size: int = 0,
        max_pages: int = DEFAULT_MAX_PAGES,
        timeout: float | None = None,
    ) -> Iterator[Approval]:
        """Every approval in `state`, page by page; raises PageLimitError past `max_pages` pages."""
        token = ""
        for _ in range(max_pages):
            page = self.list_approvals(state=state, page_size=page_size, page_token=token, timeout=timeout)
            yield from page.approvals
            if not page.next_page_token:
                return
            token = page.next_page_token
        raise PageLimitError(f"more than {max_pages} pages of approvals; pass a larger max_pages")

    def get_approval(self, approval_id: str, *, timeout: float | None = None) -> Approval:
        """One approval of the caller's tenant with its full arguments (`arguments_json`)."""
        response = self._unary(
            "GetApproval",
            self._approvals.GetApproval,
            pb.GetApprovalRequest(approval_id=approval_id),
            timeout,
            True,
            self._retry,
            _Attempts(),
        )
        return Approval.from_proto(response.approval)

    def decide(
        self, approval_id: str, decision: ApprovalDecision | str, *, reason: str = "", timeout: float | None = None
    ) -> Approval:
        """Approves or rejects a pending approval as this client's identity (not the requester)."""
        request = pb.DecideApprovalRequest(approval_id=approval_id, decision=int(_decision(decision)), reason=reason)
        # Not retried on transport errors: a repeat after a lost answer would see FAILED_PRECONDITION.
        response = self._unary("DecideApproval", self._approvals.DecideApproval, request, timeout, False, None, _Attempts())
        return Approval.from_proto(response.approval)

    def approve(self, approval_id: str, *, reason: str = "", timeout: float | None = None) -> Approval:
        return self.decide(approval_id, ApprovalDecision.APPROVE, reason=reason, timeout=timeout)

    def reject(self, approval_id: str, *, reason: str = "", timeout: float | None = None) -> Approval:
        return self.decide(approval_id, ApprovalDecision.REJECT, reason=reason, timeout=timeout)

    # --- plumbing -------------------------------------------------------------------------------

    def _metadata(self) -> tuple[Metadata, str | None]:
        identity = self._identity
        if isinstance(identity, TokenProvider):
            token = identity.token()
            return (("authorization", f"Bearer {token}"), *self._extra_metadata), token
        return (*identity.metadata(), *self._extra_metadata), None

    def _unary(
        self,
        method: str,
        stub: Any,
        request: Any,
        timeout: float | None,
        safe: bool,
        policy: RetryPolicy | None,
        attempts: _Attempts,
    ) -> Any:
        deadline = self._deadline(timeout)
        refreshed = False
        while True:
            attempts.made += 1
            metadata, token = self._metadata()
            try:
                return stub(request, metadata=metadata, timeout=deadline)
            except grpc.RpcError as rpc_error:
                error = transport_error(method, rpc_error)
                cause: BaseException = rpc_error
            if isinstance(error, UnauthenticatedError) and token is not None and not refreshed:
                # The sidecar refused the token before running anything: fetch a new one, once.
                self._identity.invalidate(token)  # type: ignore[union-attr]
                refreshed = True
                attempts.made -= 1
                continue
            delay = _transport_delay(policy, attempts, error, safe)
            if delay is None:
                raise error from cause
            policy.sleep(delay)  # type: ignore[union-attr]


class AsyncClient(_Common):
    """The asyncio client (grpc.aio). Create it inside a running event loop; `await close()`.

    Cancelling the task awaiting a call cancels the RPC, and the sidecar stops the tool's backend.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        identity: Identity,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        metadata: Mapping[str, str] | None = None,
        channel: grpc.aio.Channel | None = None,
    ):
        super().__init__(identity, timeout, retry, metadata)
        self._owns_channel = channel is None
        self._channel = (
            channel if channel is not None else grpc.aio.insecure_channel(target, options=_channel_options(target))
        )
        self._toolgate = pb_grpc.ToolGateStub(self._channel)
        self._approvals = pb_grpc.ApprovalsStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()

    async def list_tools(
        self, *, timeout: float | None = None, retry: RetryPolicy | bool | None = None
    ) -> ToolList:
        response = await self._unary(
            "ListTools", self._toolgate.ListTools, pb.ListToolsRequest(), timeout, True, self._policy(retry), _Attempts()
        )
        return ToolList.from_proto(response)

    async def execute(
        self,
        call: ToolCall | str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        run_id: str = "",
        step: int = 0,
        catalog_revision: str = "",
        timeout: float | None = None,
        retry: RetryPolicy | bool | None = None,
        check: bool = False,
    ) -> ToolResult:
        call = as_tool_call(call, arguments)
        request = _execute_request(call, run_id, step, catalog_revision)
        policy, attempts = self._policy(retry), _Attempts()
        while True:
            response = await self._unary(
                "ExecuteTool", self._toolgate.ExecuteTool, request, timeout, bool(call.idempotency_key), policy, attempts
            )
            result = ToolResult.from_proto(response.result)
            delay = _retry_delay(policy, attempts, result)
            if delay is None:
                return result.raise_for_status() if check else result
            await policy.async_sleep(delay)  # type: ignore[union-attr]

    async def execute_many(
        self,
        calls: Sequence[ToolCall],
        *,
        parallel: bool = False,
        max_parallel: int = 0,
        run_id: str = "",
        step: int = 0,
        catalog_revision: str = "",
        timeout: float | None = None,
        retry: RetryPolicy | bool | None = None,
        check: bool = False,
    ) -> list[ToolResult]:
        results: list[ToolResult | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        policy, attempts = self._policy(retry), _Attempts()
        while pending:
            batch = [calls[i] for i in pending]
            request = _batch_request(batch, run_id, step, parallel, max_parallel, catalog_revision)
            safe = all(call.idempotency_key for call in batch)
            response = await self._unary(
                "ExecuteTools", self._toolgate.ExecuteTools, request, timeout, safe, policy, attempts
            )
            for index, message in zip(pending, response.results):
                results[index] = ToolResult.from_proto(message)
            retry_now = [i for i in pending if results[i].retryable]  # type: ignore[union-attr]
            delays = [_retry_delay(policy, attempts, results[i]) for i in retry_now]  # type: ignore[arg-type]
            if not delays or any(d is None for d in delays):
                break
            await policy.async_sleep(max(d for d in delays if d is not None))  # type: ignore[union-attr]
            pending = retry_now
        done = [r for r in results if r is not None]
        if check:
            for result in done:
                result.raise_for_status()
        return done

    async def list_approvals(
        self,
        *,
        state: ApprovalState = ApprovalState.PENDING,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
        retry: RetryPolicy | bool | None = None,
    ) -> ApprovalPage:
        request = _approvals_request(state, page_size, page_token)
        response = await self._unary(
            "ListApprovals", self._approvals.ListApprovals, request, timeout, True, self._policy(retry), _Attempts()
        )
        return ApprovalPage.from_proto(response)

    async def iter_approvals(
        self,
        *,
        state: ApprovalState = ApprovalState.PENDING,
        page_size: int = 0,
        max_pages: int = DEFAULT_MAX_PAGES,
        timeout: float | None = None,
    ) -> AsyncIterator[Approval]:
        token = ""
        for _ in range(max_pages):
            page = await self.list_approvals(state=state, page_size=page_size, page_token=token, timeout=timeout)
            for approval in page.approvals:
                yield approval
            if not page.next_page_token:
                return
            token = page.next_page_token
        raise PageLimitError(f"more than {max_pages} pages of approvals; pass a larger max_pages")

    async def get_approval(self, approval_id: str, *, timeout: float | None = None) -> Approval:
        response = await self._unary(
            "GetApproval",
            self._approvals.GetApproval,
            pb.GetApprovalRequest(approval_id=approval_id),
            timeout,
            True,
            self._retry,
            _Attempts(),
        )
        return Approval.from_proto(response.approval)

    async def decide(
        self, approval_id: str, decision: ApprovalDecision | str, *, reason: str = "", timeout: float | None = None
    ) -> Approval:
        request = pb.DecideApprovalRequest(approval_id=approval_id, decision=int(_decision(decision)), reason=reason)
        response = await self._unary(
            "DecideApproval", self._approvals.DecideApproval, request, timeout, False, None, _Attempts()
        )
        return Approval.from_proto(response.approval)

    async def approve(self, approval_id: str, *, reason: str = "", timeout: float | None = None) -> Approval:
        return await self.decide(approval_id, ApprovalDecision.APPROVE, reason=reason, timeout=timeout)

    async def reject(self, approval_id: str, *, reason: str = "", timeout: float | None = None) -> Approval:
        return await self.decide(approval_id, ApprovalDecision.REJECT, reason=reason, timeout=timeout)

    async def _metadata(self) -> tuple[Metadata, str | None]:
        identity = self._identity
        if isinstance(identity, TokenProvider):
            token = await identity.atoken()
            return (("authorization", f"Bearer {token}"), *self._extra_metadata), token
        return (*identity.metadata(), *self._extra_metadata), None

    async def _unary(
        self,
        method: str,
        stub: Any,
        request: Any,
        timeout: float | None,
        safe: bool,
        policy: RetryPolicy | None,
        attempts: _Attempts,
    ) -> Any:
        deadline = self._deadline(timeout)
        refreshed = False
        while True:
            attempts.made += 1
            metadata, token = await self._metadata()
            try:
                return await stub(request, metadata=metadata, timeout=deadline)
            except grpc.aio.AioRpcError as rpc_error:
                error = transport_error(method, rpc_error)
                cause: BaseException = rpc_error
            if isinstance(error, UnauthenticatedError) and token is not None and not refreshed:
                self._identity.invalidate(token)  # type: ignore[union-attr]
                refreshed = True
                attempts.made -= 1
                continue
            delay = _transport_delay(policy, attempts, error, safe)
            if delay is None:
                raise error from cause
            await policy.async_sleep(delay)  # type: ignore[union-attr]
