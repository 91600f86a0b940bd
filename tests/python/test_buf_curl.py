"""`buf curl` against the real binary, with no .proto files: everything through server reflection.

This is the README's example, so it cannot rot. buf comes pinned from tests/tools (npm), which
.ci/run installs; set BUF_BIN to use another.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUF = Path(os.environ.get("BUF_BIN", REPO_ROOT / "tests" / "tools" / "node_modules" / ".bin" / "buf"))


def buf_curl(address: str, *args: str) -> subprocess.CompletedProcess:
    if not BUF.exists():
        pytest.fail(f"buf not found at {BUF}; run `npm ci --prefix tests/tools` (done by .ci/run)", pytrace=False)
    return subprocess.run(
        [str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_buf_curl_lists_services_through_reflection(toolgate):
    done = buf_curl(toolgate.address, "--list-services", f"http://{toolgate.address}")
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) >= {"toolgate.v1.ToolGate", "toolgate.v1.Approvals", "grpc.health.v1.Health"}


def test_buf_curl_executes_a_tool_call(toolgate):
    body = {"call": {"name": "echo", "arguments_json": json.dumps({"text": "hi from buf"})}}
    done = buf_curl(
        toolgate.address,
        "-H", "x-toolgate-tenant: acme",
        "-d", json.dumps(body),
        f"http://{toolgate.address}/toolgate.v1.ToolGate/ExecuteTool",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["result"]
    assert result["status"] == "TOOL_STATUS_OK"
    assert result["modelText"] == "hi from buf"


def test_buf_curl_sees_a_refusal_as_a_result_not_an_error(toolgate):
    arguments = {"query": "refunds", "filter": {"tenant": "acme"}}
    body = {"call": {"name": "rag_search", "arguments_json": json.dumps(arguments)}}
    done = buf_curl(
        toolgate.address,
        "-H", "x-toolgate-tenant: globex",
        "-d", json.dumps(body),
        f"http://{toolgate.address}/toolgate.v1.ToolGate/ExecuteTool",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["result"]
    assert result["status"] == "TOOL_STATUS_DENIED"
    assert result["errorType"] == "bound_argument_override"
    assert result["modelText"].startswith('TOOL_ERROR: {"errorType":"bound_argument_override"')
