"""Fixtures for the toolgate client tests: the real binary (tests/python/toolgate_process.py, shared
with the black-box suite) and clients acting as the demo's identities.

The demo catalog (examples/demo.yaml, embedded in the binary) is the fixture: dev identity on,
tenants acme and globex, refund_order needs approval and allows 5 calls a minute per tenant.
Each test module gets its own server; tests that use up a quota or need an empty approval list
take `fresh_toolgate`, a server of their own.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))

import toolgate_process  # noqa: E402
from toolgate_process import ToolgateServer  # noqa: E402

from toolgate import AsyncClient, Client, DevIdentity  # noqa: E402

AGENT_SCOPES = ("tickets:read", "tickets:write")


def demo_identity(tenant: str = "acme", subject: str = "alice", agent: str = "pytest-agent", scopes=AGENT_SCOPES):
    return DevIdentity(tenant=tenant, subject=subject, agent=agent, scopes=scopes)


def approver_identity(tenant: str = "acme") -> DevIdentity:
    """A second person who may decide approvals (scope toolgate:approve)."""
    return DevIdentity(tenant=tenant, subject="bob", scopes=("toolgate:approve",))


def _serve() -> Iterator[ToolgateServer]:
    server = toolgate_process.start()
    yield server
    code = toolgate_process.stop(server)
    assert code == 0, f"toolgate exited with {code} after SIGTERM; stderr:\n{server.stderr_text()}"


@pytest.fixture(scope="module")
def toolgate() -> Iterator[ToolgateServer]:
    """The real binary on the embedded demo catalog, one per test module (so quotas are too)."""
    yield from _serve()


@pytest.fixture
def fresh_toolgate() -> Iterator[ToolgateServer]:
    """A server of its own: fresh quotas and no approvals yet."""
    yield from _serve()


@pytest.fixture(scope="module")
def unix_toolgate() -> Iterator[tuple[ToolgateServer, str]]:
    """The demo catalog served on a Unix socket too (as the Kubernetes manifests give the agent),
    with the socket's path. The directory is made under /tmp: a socket path may not be longer
    than 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="toolgate-unix-", dir="/tmp") as directory:
        socket_path = str(Path(directory) / "toolgate.sock")
        demo = (REPO_ROOT / "examples" / "demo.yaml").read_text()
        assert "  shutdown_grace: 10s\n" in demo
        config = Path(directory) / "catalog.yaml"
        config.write_text(demo.replace("  shutdown_grace: 10s\n", f"  shutdown_grace: 10s\n  unix_socket: {socket_path}\n"))
        server = toolgate_process.start(["--config", str(config)])
        yield server, socket_path
        assert toolgate_process.stop(server) == 0


@pytest.fixture
def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_client(toolgate) -> Iterator[Callable[..., Client]]:
    """`make_client(tenant=..., subject=..., server=...)`: a sync client, closed after the test."""
    made: list[Client] = []

    def make(server: ToolgateServer | None = None, identity: object | None = None, **who) -> Client:
        client = Client((server or toolgate).address, identity=identity or demo_identity(**who))
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def client(make_client) -> Client:
    """alice in acme, with the demo's ticket scopes."""
    return make_client()


@pytest.fixture
def approver(make_client) -> Client:
    """bob in acme, who may approve."""
    return make_client(identity=approver_identity())


@pytest.fixture
async def aclient(toolgate) -> AsyncClient:
    async with AsyncClient(toolgate.address, identity=demo_identity()) as client:
        yield client


@pytest.fixture
async def aapprover(toolgate) -> AsyncClient:
    async with AsyncClient(toolgate.address, identity=approver_identity()) as client:
        yield client


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound and never listening, and held for the
    whole test (a port bound and released could meanwhile be taken by another server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A loopback address that accepts TCP but never answers: a hung sidecar."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        host, port = sock.getsockname()
        yield f"{host}:{port}"


def events_of(server: ToolgateServer, predicate: Callable[[dict], bool], count: int) -> list[dict]:
    """Waits (bounded) until `count` audit events match `predicate`; returns exactly those."""
    events = server.wait_for_audit_events(lambda all_: sum(1 for e in all_ if predicate(e)) >= count)
    return [e for e in events if predicate(e)]


def interval_ms(event: dict) -> tuple[float, float]:
    """When a call ran, from its audit event: `time` is when it started, plus `duration_ms`."""
    start = datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp() * 1000
    return start, start + event["duration_ms"]


def admin_address(server: ToolgateServer) -> str:
    """The admin endpoint's address, from the server's JSON log."""
    for line in server.stderr_lines:
        try:
            fields = json.loads(line).get("fields", {})
        except ValueError:
            continue
        if fields.get("message") == "serving /metrics, /healthz and /readyz":
            return fields["addr"]
    raise AssertionError(f"no admin address in the log:\n{server.stderr_text()}")


def wait_for_calls_in_flight(server: ToolgateServer, count: int, timeout: float = 10.0) -> None:
    """Polls /metrics (bounded) until toolgate_calls_in_flight reaches `count`."""
    url = f"http://{admin_address(server)}/metrics"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode()
        if f"toolgate_calls_in_flight {count}\n" in text:
            return
        time.sleep(0.01)  # a poll interval, not synchronisation: the condition is re-checked
    raise AssertionError(f"toolgate_calls_in_flight never reached {count} within {timeout}s")
