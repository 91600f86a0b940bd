"""AsyncClient against the real binary, and identity by JWT: fixed tokens and refreshed providers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import time

import grpc
import pytest
import toolgate_process
from conftest import REPO_ROOT, demo_identity, events_of, wait_for_calls_in_flight

from toolgate import (
    ApprovalState,
    AsyncClient,
    BearerToken,
    Client,
    DeadlineExceededError,
    TokenProvider,
    ToolCall,
    ToolStatus,
    UnauthenticatedError,
)


async def test_async_list_execute_and_batch(aclient, run_id):
    tools = await aclient.list_tools()
    assert "rag_search" in {t.name for t in tools}
    results = await aclient.execute_many(
        [ToolCall("echo", {"text": "one"}), ToolCall("rag_search", {"query": "refund policy"})],
        parallel=True,
        run_id=run_id,
        catalog_revision=tools.catalog_revision,
    )
    assert [r.status for r in results] == [ToolStatus.OK, ToolStatus.OK]
    assert results[0].model_text == "one"
    assert all(hit["id"].startswith("acme-") for hit in results[1].json()["results"])


async def test_async_approval_round_trip_with_paging(aclient, aapprover, run_id):
    arguments = {"ticket_id": "T-77"}
    first = await aclient.execute("delete_ticket", arguments, run_id=run_id)
    assert first.status is ToolStatus.APPROVAL_REQUIRED
    seen = [a.approval_id async for a in aapprover.iter_approvals(page_size=1)]
    assert first.approval_id in seen
    rejected = await aapprover.decide(first.approval_id, "reject", reason="not this one")
    assert rejected.state is ApprovalState.REJECTED

    again = await aclient.execute(ToolCall("delete_ticket", arguments, approval_id=first.approval_id), run_id=run_id)
    assert (again.status, again.error_type) == (ToolStatus.DENIED, "approval_rejected")
    assert "not this one" in again.model_text


async def test_the_async_client_talks_to_the_sidecar_over_its_unix_socket(unix_toolgate, run_id):
    server, socket_path = unix_toolgate
    async with AsyncClient(f"unix://{socket_path}", identity=demo_identity()) as over_socket:
        result = await over_socket.execute("echo", {"text": "over the socket"}, run_id=run_id)
    assert (result.status, result.model_text) == (ToolStatus.OK, "over the socket"), result
    assert events_of(server, lambda e: e.get("run_id") == run_id, 1)[0]["status"] == "OK"


async def test_an_async_call_its_own_deadline_ends_is_a_timeout_result(aclient):
    result = await aclient.execute("slow_task", {"ms": 5000}, timeout=0.9)
    assert (result.status, result.error_type) == (ToolStatus.TIMEOUT, "timeout"), result


async def test_async_deadline_against_a_hung_sidecar(silent_listener):
    async with AsyncClient(silent_listener, identity=BearerToken("x"), timeout=0.5) as hung:
        with pytest.raises(DeadlineExceededError) as raised:
            await hung.list_tools()
    assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED


async def test_cancelling_the_task_cancels_the_call_on_the_sidecar(aclient, toolgate, run_id):
    task = asyncio.ensure_future(aclient.execute("slow_task", {"ms": 3000}, run_id=run_id, timeout=5))
    # Cancel once the sidecar is running the call.
    await asyncio.get_running_loop().run_in_executor(None, wait_for_calls_in_flight, toolgate, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [event] = await asyncio.get_running_loop().run_in_executor(
        None, lambda: events_of(toolgate, lambda e: e.get("run_id") == run_id, 1)
    )
    assert event["status"] == "CANCELLED", event


# --- JWT identity ------------------------------------------------------------------------------

SECRET = "client-test-secret-of-at-least-32-bytes"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(tenant: str = "acme", expires_in: int = 300, **claims) -> str:
    """An HS256 JWT the JWT-configured sidecar accepts (or, with expires_in < 0, refuses)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = {"tenant": tenant, "sub": "alice", "exp": int(time.time()) + expires_in, **claims}
    payload = _b64(json.dumps(body).encode())
    signature = hmac.new(SECRET.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


@pytest.fixture(scope="module")
def jwt_toolgate(tmp_path_factory):
    """The demo catalog with dev identity off and HS256 JWTs on."""
    demo = (REPO_ROOT / "examples" / "demo.yaml").read_text()
    assert "  dev_identity: true\n" in demo
    config = tmp_path_factory.mktemp("jwt") / "catalog.yaml"
    # Without the demo's console: its development sign-in needs dev identity.
    demo = re.sub(r"  console:\n(    .*\n)+", "", demo)
    config.write_text(
        demo.replace("  dev_identity: true\n", "  dev_identity: false\n  jwt:\n    hs256_secret_env: TG_CLIENT_TEST_SECRET\n")
    )
    server = toolgate_process.start(["--config", str(config)], env={"TG_CLIENT_TEST_SECRET": SECRET})
    yield server
    assert toolgate_process.stop(server) == 0


def test_a_bearer_token_is_the_identity(jwt_toolgate):
    with Client(jwt_toolgate.address, identity=BearerToken(mint(tenant="globex"))) as client:
        hits = client.execute("rag_search", {"query": "refund"}).json()["results"]
    assert hits and all(hit["id"].startswith("globex-") for hit in hits)
    with Client(jwt_toolgate.address, identity=BearerToken(mint(expires_in=-120))) as expired:
        with pytest.raises(UnauthenticatedError) as raised:
            expired.list_tools()
    assert raised.value.code is grpc.StatusCode.UNAUTHENTICATED


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_provider_is_refreshed_on_schedule_and_after_a_refusal(jwt_toolgate):
    tokens = [mint(expires_in=-120), mint(), mint()]  # the first one is already expired
    fetched: list[str] = []

    def fetch() -> str:
        fetched.append(tokens[len(fetched)])
        return fetched[-1]

    clock = Clock()
    provider = TokenProvider(fetch, refresh_after=60, clock=clock)
    with Client(jwt_toolgate.address, identity=provider) as client:
        assert client.execute("echo", {"text": "hi"}).model_text == "hi"
        assert fetched == tokens[:2], "the refused token was replaced and the call repeated once"
        client.list_tools()
        assert len(fetched) == 2, "a fresh token is reused"
        clock.now += 61
        client.list_tools()
        assert fetched == tokens, "fetched again once refresh_after passed"


async def test_an_async_token_provider(jwt_toolgate):
    calls = 0

    async def fetch() -> str:
        nonlocal calls
        calls += 1
        return mint(expires_in=-120) if calls == 1 else mint()

    async with AsyncClient(jwt_toolgate.address, identity=TokenProvider(fetch)) as client:
        assert (await client.execute("echo", {"text": "async"})).model_text == "async"
    assert calls == 2


def test_a_provider_that_keeps_failing_surfaces_unauthenticated(jwt_toolgate):
    provider = TokenProvider(lambda: mint(expires_in=-120))
    with Client(jwt_toolgate.address, identity=provider) as client:
        with pytest.raises(UnauthenticatedError):
            client.list_tools()
