"""Retries that can never write twice, against the real binary and a real HTTP upstream that counts
the writes it received: the client repeats only what the sidecar marks `retryable`, a write whose
upstream failed after receiving it is not, and a batch re-sends only its retryable calls."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import toolgate_process
from conftest import demo_identity

from toolgate import AsyncClient, Client, RetryPolicy, ToolCall, ToolStatus, UnavailableError


class CountingUpstream:
    """An HTTP upstream on loopback that reads each POST whole, counts it by path, then answers by
    path: `/fail500` and `/read500` with a 500, `/break` by closing the connection without an
    answer, anything else 200 `{}`. Every counted request is a write that reached it."""

    def __init__(self) -> None:
        self.received: Counter[str] = Counter()
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                self.rfile.read(int(self.headers.get("content-length", "0")))
                with upstream.lock:
                    upstream.received[self.path] += 1
                if self.path == "/break":
                    self.close_connection = True  # the write happened; no answer comes
                    return
                status, body = (500, b"") if self.path in ("/fail500", "/read500") else (200, b"{}")
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.received)

    def clear(self) -> None:
        with self.lock:
            self.received.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _tool(name: str, risk_level: str, upstream: str, path: str) -> str:
    return (
        f"  - {{ name: {name}, description: d, risk_level: {risk_level}, timeout: 5s, "
        f'executor: {{ http: {{ upstream: {upstream}, path: "{path}" }} }}, input_schema: {{ type: object }} }}\n'
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[CountingUpstream]:
    counting = CountingUpstream()
    yield counting
    counting.close()


@pytest.fixture(scope="module")
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections, held (bound, never listening) for the module."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def writes_toolgate(upstream, refused_port, tmp_path_factory):
    """The real binary with HTTP write tools in front of the counting upstream."""
    catalog = tmp_path_factory.mktemp("writes") / "catalog.yaml"
    catalog.write_text(
        "version: 1\nidentity: { dev_identity: true }\ntenants: { acme: {} }\nupstreams:\n"
        f"  svc: {{ url: 'http://{upstream.address}', allow_schemes: [http], allow_private_addresses: true }}\n"
        f"  down: {{ url: 'http://127.0.0.1:{refused_port}', allow_schemes: [http], allow_private_addresses: true }}\n"
        "tools:\n"
        + _tool("write_500", "write_draft", "svc", "/fail500")
        + _tool("write_broken", "write_draft", "svc", "/break")
        + _tool("write_ok", "write_draft", "svc", "/ok")
        + _tool("read_500", "read_only", "svc", "/read500")
        + _tool("write_down", "write_draft", "down", "")
    )
    server = toolgate_process.start(["--config", str(catalog)])
    yield server
    assert toolgate_process.stop(server) == 0


class RecordedSleeps(list):
    """A RetryPolicy sleep (sync or async) that records each wait instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)

    async def asleep(self, seconds: float) -> None:
        self.append(seconds)


def _policy(sleeps: RecordedSleeps) -> RetryPolicy:
    return RetryPolicy(max_attempts=3, sleep=sleeps, async_sleep=sleeps.asleep)


@pytest.mark.parametrize(("tool", "path"), [("write_500", "/fail500"), ("write_broken", "/break")])
@pytest.mark.parametrize("key", ["", "key-1"])
def test_a_write_whose_upstream_failed_after_receiving_it_is_sent_once(writes_toolgate, upstream, tool, path, key):
    upstream.clear()
    sleeps = RecordedSleeps()
    with Client(writes_toolgate.address, identity=demo_identity(), retry=_policy(sleeps)) as client:
        result = client.execute(ToolCall(tool, {"amount": 1}, idempotency_key=f"{key}-{tool}" if key else ""))
        assert upstream.counts() == {path: 1}, "one execute(), one write"
        assert (result.status, result.error_type, result.retryable) == (
            ToolStatus.ERROR,
            "upstream_unavailable",
            False,
        ), result
        assert "outcome is unknown" in result.model_text
        assert sleeps == [], "a write of unknown outcome is not retried"
        if key:
            # A repeat by the agent itself, with the same key: the stored outcome, not a new write.
            again = client.execute(ToolCall(tool, {"amount": 1}, idempotency_key=f"{key}-{tool}"))
            assert (again.idempotent_replay, again.retryable) == (True, False), again
    assert upstream.counts() == {path: 1}


async def test_the_async_client_sends_such_a_write_once_too(writes_toolgate, upstream):
    upstream.clear()
    sleeps = RecordedSleeps()
    async with AsyncClient(writes_toolgate.address, identity=demo_identity(), retry=_policy(sleeps)) as client:
        result = await client.execute("write_500", {"amount": 1})
    assert upstream.counts() == {"/fail500": 1}, "one execute(), one write"
    assert (result.error_type, result.retryable, sleeps) == ("upstream_unavailable", False, [])


def test_a_write_whose_upstream_was_never_reached_is_retried(writes_toolgate, upstream):
    upstream.clear()
    sleeps = RecordedSleeps()
    with Client(writes_toolgate.address, identity=demo_identity(), retry=_policy(sleeps)) as client:
        result = client.execute("write_down", {"amount": 1})
    assert (result.error_type, result.retryable) == ("upstream_unavailable", True), result
    assert len(sleeps) == 2, "connection refused: nothing was written, so every attempt is made"


@pytest.mark.parametrize("use_async", [False, True])
async def test_execute_many_re_sends_only_the_retryable_calls(writes_toolgate, upstream, use_async):
    upstream.clear()
    sleeps = RecordedSleeps()
    calls = [
        ToolCall("read_500", {}, call_id="read"),  # retryable: a read-only tool's 500
        ToolCall("write_ok", {}, call_id="ok"),
        ToolCall("write_500", {}, call_id="write"),  # not retryable: a write of unknown outcome
    ]
    if use_async:
        async with AsyncClient(writes_toolgate.address, identity=demo_identity(), retry=_policy(sleeps)) as client:
            results = await client.execute_many(calls)
    else:
        with Client(writes_toolgate.address, identity=demo_identity(), retry=_policy(sleeps)) as client:
            results = client.execute_many(calls)
    assert [(r.call_id, r.status, r.retryable) for r in results] == [
        ("read", ToolStatus.ERROR, True),
        ("ok", ToolStatus.OK, False),
        ("write", ToolStatus.ERROR, False),
    ]
    assert len(sleeps) == 2
    assert upstream.counts() == {"/read500": 3, "/ok": 1, "/fail500": 1}


async def test_the_async_client_retries_the_approval_reads_on_unavailable_and_never_a_decision(closed_port):
    sleeps = RecordedSleeps()
    policy = RetryPolicy(max_attempts=4, sleep=sleeps, async_sleep=sleeps.asleep)
    async with AsyncClient(f"127.0.0.1:{closed_port}", identity=demo_identity(), retry=policy) as down:
        for read in (down.list_approvals, lambda: down.get_approval("apr_x")):
            sleeps.clear()
            with pytest.raises(UnavailableError):
                await read()
            assert len(sleeps) == 3, read
        sleeps.clear()
        with pytest.raises(UnavailableError):
            await down.approve("apr_x")
        assert sleeps == []
