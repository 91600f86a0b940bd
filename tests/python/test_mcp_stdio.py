"""`toolgate mcp-stdio` as an MCP host sees it: the official Python MCP SDK launches the proxy over
stdio, and the proxy forwards to the demo sidecar's MCP door.

What the proxy shows is checked against the sidecar itself: the tools it lists are those the gRPC
door's ListTools returns for the same caller, and each call leaves the sidecar's audit event with
door "mcp". A proxy whose door is down answers every request with an error naming the URL, and
exits 0 when the host closes stdin. Every wait is bounded; nothing sleeps to synchronize.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path

import anyio
import pytest
import toolgate_process
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from toolgate_process import REPO_ROOT, ToolgateServer, _toolgate_bin

TOOLGATE = "toolgate.v1.ToolGate"
# The whole of one host session: start, handshake, a few calls, shutdown.
SESSION_TIMEOUT_S = 60.0
# How long the proxy may take to exit once its stdin is closed.
EXIT_TIMEOUT_S = 10.0
# The log line the proxy writes on stderr when it cannot reach the door.
UNREACHABLE_LOG = "cannot forward to the sidecar's MCP door"


def proxy(url: str, *flags: str) -> StdioServerParameters:
    """The host's launch of `toolgate mcp-stdio --url URL FLAGS…`."""
    return StdioServerParameters(command=str(_toolgate_bin()), args=["mcp-stdio", "--url", url, *flags])


def door_url(server: ToolgateServer) -> str:
    assert server.mcp_address, f"the sidecar did not serve its MCP door; stderr:\n{server.stderr_text()}"
    return f"http://{server.mcp_address}/mcp"


def closed_port_url() -> str:
    """A loopback URL nothing listens on: a port the kernel just gave out, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp"


def run_host(session) -> None:
    """Runs `session` (an async function) to completion, bounded."""

    async def bounded() -> None:
        with anyio.fail_after(SESSION_TIMEOUT_S):
            await session()

    anyio.run(bounded)


def tool_error(result) -> dict:
    """The TOOL_ERROR payload of a refused call's text."""
    text = result.content[0].text
    assert text.startswith("TOOL_ERROR: "), text
    return json.loads(text.removeprefix("TOOL_ERROR: "))


@pytest.mark.parametrize(("mode", "revision"), [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
def test_a_host_lists_and_calls_the_sidecars_tools_through_the_proxy(toolgate, api, identity, mode, revision):
    subject = f"mcp-stdio-{uuid.uuid4().hex[:12]}"
    caller = ("--tenant", "acme", "--subject", subject, "--agent", "pytest-host", "--scopes", "tickets:read")
    # The oracle: what the gRPC door answers the same caller (another subject, so that its audit
    # events are not taken for the proxy's).
    grpc_caller = identity(subject=f"{subject}-grpc", agent="pytest-host", scopes=("tickets:read",))
    request_cls, list_tools = api.unary(TOOLGATE, "ListTools")
    expected = sorted(t.name for t in list_tools(request_cls(), metadata=grpc_caller).tools)
    request_cls, execute = api.unary(TOOLGATE, "ExecuteTool")
    request = request_cls(run_id="pytest-run")
    request.call.name = "delete_ticket"
    request.call.arguments_json = json.dumps({"ticket_id": "T-1"})
    grpc_refusal = execute(request, metadata=grpc_caller).result
    # delete_ticket needs tickets:write, which this caller does not have.
    assert grpc_refusal.error_type in ("scope_missing", "tool_not_found"), grpc_refusal
    text = f"through the proxy {uuid.uuid4().hex}"
    seen = {}

    async def session() -> None:
        async with Client(proxy(door_url(toolgate), *caller), mode=mode) as client:
            seen["revision"] = client.protocol_version
            seen["tools"] = client.server_capabilities.tools
            seen["listed"] = sorted(t.name for t in (await client.list_tools()).tools)
            seen["echo"] = await client.call_tool("echo", {"text": text})
            seen["refused"] = await client.call_tool("delete_ticket", {"ticket_id": "T-1"})

    run_host(session)

    assert seen["revision"] == revision
    assert seen["tools"] is not None, "the proxy must offer the door's tools capability"
    assert seen["listed"] == expected
    assert "echo" in seen["listed"] and "delete_ticket" not in seen["listed"]
    echo = seen["echo"]
    assert not echo.is_error, echo
    assert [c.text for c in echo.content] == [text]
    refused = seen["refused"]
    assert refused.is_error, refused
    error = tool_error(refused)
    assert error["errorType"] == grpc_refusal.error_type, error
    assert error["error"] == grpc_refusal.error_message, error
    assert error["tool"] == "delete_ticket", error

    def mine(events):
        return [e for e in events if e.get("kind") == "tool_call" and e.get("subject") == subject]

    events = mine(toolgate.wait_for_audit_events(lambda events: len(mine(events)) >= 2))
    by_tool = {e["tool"]: e for e in events}
    assert sorted(by_tool) == ["delete_ticket", "echo"], events
    for event in events:
        assert event["door"] == "mcp", event
        assert event["tenant"] == "acme", event
        assert event["agent"] == "pytest-host", event
    assert by_tool["echo"]["status"] == "OK"
    assert by_tool["delete_ticket"]["status"] not in ("OK", "")
    assert by_tool["delete_ticket"]["error_type"] == grpc_refusal.error_type


def test_the_hosts_meta_reaches_the_door(toolgate):
    # The proxy sends the host's `_meta` on as it came (less its own connection's keys); the
    # door takes `toolgate/run_id` from it.
    subject = f"mcp-stdio-meta-{uuid.uuid4().hex[:12]}"
    run_id = f"run-{uuid.uuid4().hex[:12]}"

    async def session() -> None:
        async with Client(proxy(door_url(toolgate), "--tenant", "acme", "--subject", subject)) as client:
            result = await client.call_tool("echo", {"text": "meta"}, meta={"toolgate/run_id": run_id})
            assert not result.is_error, result

    run_host(session)

    def mine(events):
        return [e for e in events if e.get("kind") == "tool_call" and e.get("subject") == subject]

    (event,) = mine(toolgate.wait_for_audit_events(mine))
    assert event["run_id"] == run_id, event


def test_a_door_that_is_not_there_fails_each_request_naming_its_url(tmp_path):
    url = closed_port_url()
    errlog_path = tmp_path / "proxy-stderr.log"
    errors = []

    async def session() -> None:
        with errlog_path.open("w") as errlog:
            async with Client(stdio_client(proxy(url, "--tenant", "acme"), errlog=errlog)) as client:
                for request in (client.list_tools, lambda: client.call_tool("echo", {"text": "x"})):
                    with pytest.raises(MCPError) as raised:
                        await request()
                    errors.append(raised.value)

    run_host(session)

    assert len(errors) == 2
    for error in errors:
        assert url in str(error), str(error)
        assert "Connection refused" in str(error), str(error)
    logged = [line for line in errlog_path.read_text().splitlines() if UNREACHABLE_LOG in line]
    assert logged and all(url in line for line in logged), errlog_path.read_text()


def test_a_token_file_is_sent_as_the_bearer_token(toolgate, tmp_path):
    # Not a JWT the demo accepts: the door answers 401 invalid_token, which it says only of a
    # token it was sent (the file's line break trimmed, or the proxy would not start).
    token_file = tmp_path / "token"
    token_file.write_text("  not.a.jwt\n")
    url = door_url(toolgate)
    errors = []

    async def session() -> None:
        async with Client(proxy(url, "--token-file", str(token_file))) as client:
            with pytest.raises(MCPError) as raised:
                await client.list_tools()
            errors.append(str(raised.value))

    run_host(session)

    (error,) = errors
    assert url in error and "invalid_token" in error, error


def test_a_token_and_dev_identity_are_refused_together():
    done = subprocess.run(
        [str(_toolgate_bin()), "mcp-stdio", "--token", "x", "--tenant", "acme"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done
    assert "cannot be used with" in done.stderr and "--tenant" in done.stderr, done.stderr
    assert done.stdout == ""


class RawHost:
    """The proxy on pipes, driven line by line: what the SDK hides (the exit code, every stdout line)."""

    def __init__(self, url: str):
        self.process = subprocess.Popen(
            [str(_toolgate_bin()), "mcp-stdio", "--url", url, "--tenant", "acme"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def answer(self, request_id: int) -> dict:
        """The next stdout line, which must be the JSON-RPC answer to `request_id`."""
        line = self.lines.get(timeout=SESSION_TIMEOUT_S)
        assert line is not None, f"stdout ended; stderr:\n{''.join(self.stderr)}"
        message = json.loads(line)
        assert message.get("id") == request_id, message
        return message

    def close_stdin_and_wait(self) -> int:
        self.process.stdin.close()
        try:
            return self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=EXIT_TIMEOUT_S)
            pytest.fail(f"the proxy did not exit within {EXIT_TIMEOUT_S:.0f}s of its stdin closing", pytrace=False)


@pytest.mark.parametrize("door", ["up", "down"])
def test_the_proxy_exits_0_when_the_host_closes_stdin(toolgate, door):
    url = door_url(toolgate) if door == "up" else closed_port_url()
    host = RawHost(url)
    host.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
        }
    )
    assert host.answer(1)["result"]["protocolVersion"] == "2025-11-25"
    host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    host.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "bye"}}})
    called = host.answer(2)
    # A line that is not JSON-RPC is passed over: not a reason to stop, let alone to panic.
    host.process.stdin.write("not json\n")
    host.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
    listed = host.answer(3)
    if door == "up":
        assert called["result"]["content"] == [{"type": "text", "text": "bye"}], called
        assert "echo" in [t["name"] for t in listed["result"]["tools"]], listed
    else:
        for answer in (called, listed):
            assert url in answer["error"]["message"], answer
    assert host.close_stdin_and_wait() == 0, "".join(host.stderr)
    # stdout carried the protocol and nothing else.
    rest = []
    while (line := host.lines.get(timeout=EXIT_TIMEOUT_S)) is not None:
        rest.append(json.loads(line))
    assert all(m.get("jsonrpc") == "2.0" for m in rest), rest
    assert "panicked" not in "".join(host.stderr)


def metrics_gauge(admin: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not on /metrics")


@pytest.fixture(scope="module")
def slow_toolgate(tmp_path_factory):
    """The demo catalog with slow_task's timeout at 60 s, so only a cancellation ends it early."""
    demo = (REPO_ROOT / "examples" / "demo.yaml").read_text()
    assert demo.count("timeout: 1000ms") == 1
    config: Path = tmp_path_factory.mktemp("slow") / "catalog.yaml"
    config.write_text(demo.replace("timeout: 1000ms", "timeout: 60s"))
    server = toolgate_process.start(["--config", str(config)])
    yield server
    assert toolgate_process.stop(server) == 0, server.stderr_text()


def test_a_call_the_host_cancels_is_dropped_at_the_door(slow_toolgate):
    admin = slow_toolgate.admin_address
    assert admin, slow_toolgate.stderr_text()
    subject = f"mcp-stdio-cancel-{uuid.uuid4().hex[:12]}"

    def mine(events):
        return [e for e in events if e.get("kind") == "tool_call" and e.get("subject") == subject]

    seen = {}

    async def session() -> None:
        async with Client(proxy(door_url(slow_toolgate), "--tenant", "acme", "--subject", subject)) as client:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.call_tool, "slow_task", {"ms": 50_000})
                # Bounded by the session's timeout: until the door runs the call.
                while metrics_gauge(admin, "toolgate_calls_in_flight") < 1:
                    await anyio.sleep(0.02)
                # The host gives up: the SDK sends notifications/cancelled to the proxy.
                tasks.cancel_scope.cancel()
            # Still connected (so it is the cancellation, not the host going away, that ends the
            # call): the audit event comes within the audit wait (10 s), far short of the 50 s
            # the call would otherwise run.
            seen["events"] = mine(await anyio.to_thread.run_sync(slow_toolgate.wait_for_audit_events, mine))
            # And the proxy serves on.
            seen["after"] = await client.call_tool("echo", {"text": "still here"})

    run_host(session)

    (event,) = seen["events"]
    assert event["door"] == "mcp", event
    assert event["tool"] == "slow_task", event
    assert event["status"] == "CANCELLED", event
    assert event["duration_ms"] < 50_000, event
    assert [c.text for c in seen["after"].content] == ["still here"]
