"""Runs the real toolgate binary for black-box tests: `toolgate serve --listen 127.0.0.1:0 ...`.

`start()` runs it (on the embedded demo catalog unless given `--config`), learns the bound address
from its JSON log on stderr, and keeps its stdout (audit events) for `wait_for_audit_events`;
`stop()` sends SIGTERM and returns the exit code. Every wait is bounded; nothing sleeps to
synchronize. Used by tests/python/conftest.py and by the client package tests
(clients/python/tests/conftest.py), which put this directory on sys.path.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO_ROOT / "target" / "debug" / "toolgate"

STARTUP_TIMEOUT_S = 30.0
# The demo catalog's shutdown_grace is 10s; allow that plus some slack.
SHUTDOWN_TIMEOUT_S = 20.0
# Applied to every RPC the tests make that does not set its own deadline (reflection included).
DEFAULT_RPC_DEADLINE_S = 10.0
# Audit events are written from a queue, so they can trail the RPC's answer a little.
AUDIT_TIMEOUT_S = 10.0

SERVING_ADDR_MESSAGE = "serving gRPC over TCP"
MCP_ADDR_MESSAGE = "serving MCP over Streamable HTTP"
ADMIN_ADDR_MESSAGE = "serving /metrics, /healthz and /readyz"
CONSOLE_ADDR_MESSAGE = "serving the approvals console"
READY_MESSAGE = "catalog loaded; SERVING"


@dataclass
class ToolgateServer:
    """A running toolgate process and what it has printed so far."""

    process: subprocess.Popen
    address: str
    # The MCP door's host:port, when the catalog configures server.mcp (the demo does).
    mcp_address: str | None = None
    # The admin endpoint's host:port (/metrics, /healthz, /readyz).
    admin_address: str | None = None
    # The approvals console's host:port, when the catalog configures server.console (the demo does).
    console_address: str | None = None
    stderr_lines: list[str] = field(default_factory=list)
    stdout_lines: list[str] = field(default_factory=list)
    # Notified (with its lock held) each time a stdout line is appended.
    stdout_changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    pumps: list[threading.Thread] = field(default_factory=list, repr=False)

    def stderr_text(self) -> str:
        return "".join(self.stderr_lines)

    def audit_events(self) -> list[dict]:
        """The audit events printed so far: the JSON-object lines on stdout."""
        with self.stdout_changed:
            lines = list(self.stdout_lines)
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events

    def wait_for_audit_events(self, predicate, timeout: float = AUDIT_TIMEOUT_S) -> list[dict]:
        """Waits (bounded) until `predicate(events)` is truthy for the audit events so far.

        Returns the events; fails the test with what was seen if the wait runs out.
        """
        with self.stdout_changed:
            if self.stdout_changed.wait_for(lambda: predicate(self.audit_events()), timeout=timeout):
                return self.audit_events()
        seen = "".join(self.stdout_lines[-20:])
        pytest.fail(
            f"no matching audit events within {timeout:.0f}s; last stdout lines:\n{seen}", pytrace=False
        )


def _toolgate_bin() -> Path:
    configured = os.environ.get("TOOLGATE_BIN")
    path = Path(configured).resolve() if configured else DEFAULT_BIN
    if not path.is_file() or not os.access(path, os.X_OK):
        source = "TOOLGATE_BIN" if configured else "the default path"
        pytest.fail(
            f"toolgate binary not found at {path} ({source}); run `cargo build` in {REPO_ROOT} "
            "first, or set TOOLGATE_BIN to the binary",
            pytrace=False,
        )
    return path


def _pump(
    stream, sink: list[str], lines: queue.Queue | None, changed: threading.Condition | None = None
) -> None:
    """Read `stream` to EOF so the child never blocks on a full pipe; forward lines to `lines`."""
    for line in stream:
        if changed is None:
            sink.append(line)
        else:
            with changed:
                sink.append(line)
                changed.notify_all()
        if lines is not None:
            lines.put(line)
    if lines is not None:
        lines.put(None)  # EOF


def _log_message(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    fields = record.get("fields") if isinstance(record, dict) else None
    return fields if isinstance(fields, dict) else None


def _wait_until_serving(server: ToolgateServer, lines: queue.Queue) -> str:
    """Read log lines until the server is bound and SERVING; return the bound address."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    address = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(
                f"toolgate did not report SERVING within {STARTUP_TIMEOUT_S:.0f}s; "
                f"stderr so far:\n{server.stderr_text()}"
            )
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            code = server.process.wait(timeout=SHUTDOWN_TIMEOUT_S)
            raise RuntimeError(
                f"toolgate exited with code {code} before serving; stderr:\n{server.stderr_text()}"
            )
        fields = _log_message(line)
        if fields is None:
            continue
        if fields.get("message") == SERVING_ADDR_MESSAGE:
            address = fields.get("addr")
        elif fields.get("message") == MCP_ADDR_MESSAGE:
            server.mcp_address = fields.get("addr")
        elif fields.get("message") == ADMIN_ADDR_MESSAGE:
            server.admin_address = fields.get("addr")
        elif fields.get("message") == CONSOLE_ADDR_MESSAGE:
            server.console_address = fields.get("addr")
        elif fields.get("message") == READY_MESSAGE:
            if address is None:
                raise RuntimeError(
                    f"toolgate reported SERVING before its address; stderr:\n{server.stderr_text()}"
                )
            return address


def _stop(server: ToolgateServer) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=SHUTDOWN_TIMEOUT_S)
        pytest.fail(
            f"toolgate did not exit within {SHUTDOWN_TIMEOUT_S:.0f}s of SIGTERM (killed); "
            f"stderr:\n{server.stderr_text()}",
            pytrace=False,
        )



def start(
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    command: Sequence[str] | None = None,
) -> ToolgateServer:
    """Starts the binary and returns once it is bound and SERVING (fails the test otherwise).

    `args` are added to `serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --log-format json`;
    `env` is added to the caller's environment less TOOLGATE_* and RUST_LOG. `command` replaces
    `toolgate serve` (e.g. `podman run … IMAGE`, whose entrypoint is `toolgate serve`).
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLGATE_") and k != "RUST_LOG"}
    process = subprocess.Popen(
        [
            *(command if command is not None else (str(_toolgate_bin()), "serve")),
            *("--listen", "127.0.0.1:0"),
            *("--admin-listen", "127.0.0.1:0"),
            *("--mcp-listen", "127.0.0.1:0"),
            *("--console-listen", "127.0.0.1:0"),
            *("--log-format", "json"),
            *args,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**base, **(env or {})},
        cwd=cwd,
    )
    server = ToolgateServer(process=process, address="")
    lines: queue.Queue = queue.Queue()
    server.pumps = [
        threading.Thread(target=_pump, args=(process.stderr, server.stderr_lines, lines), daemon=True),
        threading.Thread(
            target=_pump,
            args=(process.stdout, server.stdout_lines, None, server.stdout_changed),
            daemon=True,
        ),
    ]
    for pump in server.pumps:
        pump.start()
    startup_error = None
    try:
        server.address = _wait_until_serving(server, lines)
    except (TimeoutError, RuntimeError) as err:
        startup_error = str(err)
    if startup_error is not None:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=SHUTDOWN_TIMEOUT_S)
        pytest.fail(startup_error, pytrace=False)
    return server


def stop(server: ToolgateServer) -> int:
    """SIGTERM, then the exit code (bounded; kills and fails the test if it does not exit)."""
    code = _stop(server)
    for pump in server.pumps:
        pump.join(timeout=SHUTDOWN_TIMEOUT_S)
    return code
