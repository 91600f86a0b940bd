"""examples/python/agent_loop.py against the real binary, with stubs generated at test time.

The stubs come from examples/python/gen.sh (grpcio-tools) into a temporary directory, exactly as a
user generates them; nothing generated is checked in. The example is imported from its file and run
once per module; the tests then check its transcript and the audit events the server printed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO_ROOT / "examples" / "python"
GEN_TIMEOUT_S = 120
SCRIPT_TIMEOUT_S = 60


def _import_example():
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE_DIR / "agent_loop.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


agent_loop = _import_example()


@pytest.fixture(scope="module")
def stubs_dir(tmp_path_factory) -> Path:
    """gen.sh's output in a fresh temporary directory, generated with this interpreter."""
    out = tmp_path_factory.mktemp("toolgate_stubs")
    done = subprocess.run(
        ["bash", str(EXAMPLE_DIR / "gen.sh"), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=GEN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"gen.sh failed:\n{done.stdout}{done.stderr}"
    assert (out / "toolgate" / "v1" / "toolgate_pb2_grpc.py").is_file()
    return out


@pytest.fixture(scope="module")
def stubs(stubs_dir):
    return agent_loop.load_stubs(stubs_dir)


@pytest.fixture(scope="module")
def run(channel, stubs):
    """One run of the demo conversation, approved by bob through the Approvals service."""
    approver = agent_loop.approve_through_approvals_service(channel, stubs)
    return agent_loop.run_agent_loop(channel, stubs, approver)


def tool_messages(run) -> dict[str, dict]:
    return {m["tool_call_id"]: m for m in run.transcript if m["role"] == "tool"}


def test_the_model_is_shown_the_callers_tools_without_bound_arguments(run):
    tools = {tool["name"]: tool for tool in run.tools}
    assert {"echo", "rag_search", "create_ticket", "refund_order"} <= set(tools)
    assert "filter" not in tools["rag_search"]["parameters"]["properties"]
    assert tools["refund_order"]["parameters"]["required"] == ["order_id", "amount_cents"]
    assert run.catalog_revision


def test_the_transcript_holds_each_results_model_text(run):
    roles = [m["role"] for m in run.transcript]
    assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant", "tool"]
    messages = tool_messages(run)
    assert list(messages) == ["call_echo", "call_search", "call_ticket", "call_refund"]

    assert messages["call_echo"]["status"] == "TOOL_STATUS_OK"
    assert messages["call_echo"]["content"] == "Hello from the agent loop"

    ticket = json.loads(messages["call_ticket"]["content"])
    assert ticket["title"] == "Refund order A-1001"
    assert ticket["status"] == "draft"
    assert ticket["created_by"] == "alice"


def test_rag_search_only_finds_the_callers_tenants_documents(run):
    search = tool_messages(run)["call_search"]
    assert search["status"] == "TOOL_STATUS_OK"
    hits = json.loads(search["content"])["results"]
    assert hits, "the acme refund policy should match"
    assert all(hit["id"].startswith("acme-") for hit in hits), hits
    assert "acme-1" in {hit["id"] for hit in hits}
    assert "globex" not in search["content"].lower()


def test_the_refund_runs_after_approval(run):
    refund = tool_messages(run)["call_refund"]
    assert refund["status"] == "TOOL_STATUS_OK", refund
    assert json.loads(refund["content"]) == {"refunded": "A-1001", "amount_cents": 2500, "status": "refunded"}


def test_the_audit_trail_shows_the_turn_and_the_approval(run, toolgate):
    def of_run(events):
        return [e for e in events if e.get("run_id") == run.run_id]

    def refund_done(events):
        return any(
            e.get("kind") == "tool_call" and e.get("tool") == "refund_order" and e.get("status") == "OK"
            for e in of_run(events)
        )

    events = of_run(toolgate.wait_for_audit_events(refund_done))

    first_turn = {e["call_id"]: e for e in events if e["kind"] == "tool_call" and e["step"] == 1}
    assert set(first_turn) == {"call_echo", "call_search", "call_ticket"}
    assert all(e["status"] == "OK" and e["subject"] == "alice" for e in first_turn.values())

    refund = [e for e in events if e["tool"] == "refund_order"]
    assert [(e["kind"], e["status"]) for e in refund] == [
        ("tool_call", "APPROVAL_REQUIRED"),
        ("approval_decision", "APPROVED"),
        ("tool_call", "OK"),
    ]
    required, decision, done = refund
    assert required["error_type"] == "approval_required"
    approval_id = required["approval_id"]
    assert approval_id.startswith("apr_")
    assert decision["approval_id"] == approval_id
    assert decision["approver"] == "bob"
    assert decision["subject"] == "alice", "the decision records who requested the call"
    assert done["approval_id"] == approval_id
    assert done["call_id"] == "call_refund"


def test_a_refused_approval_leaves_the_refusal_in_the_transcript(channel, stubs):
    pb2, pb2_grpc = stubs
    # Another tenant, so this run does not eat into acme's refund_order quota.
    identity = agent_loop.Identity(tenant="globex", subject="carol", agent="agent-loop-example")
    approver = agent_loop.Identity(tenant="globex", subject="dave", scopes=("toolgate:approve",))
    model = agent_loop.ScriptedModel(
        [[agent_loop.ProposedCall("call_refund", "refund_order", {"order_id": "G-7", "amount_cents": 100})]]
    )
    approvals = pb2_grpc.ApprovalsStub(channel)
    asked = []

    def reject(approval_id: str) -> bool:
        """A second person says no, through the Approvals service (not only to this loop)."""
        asked.append(approval_id)
        decided = approvals.DecideApproval(
            pb2.DecideApprovalRequest(
                approval_id=approval_id,
                decision=pb2.APPROVAL_DECISION_REJECT,
                reason="order G-7 was never delivered",
            ),
            metadata=approver.metadata(),
            timeout=agent_loop.RPC_TIMEOUT_S,
        )
        return decided.approval.state == pb2.APPROVAL_STATE_APPROVED

    run = agent_loop.run_agent_loop(channel, stubs, reject, model=model, identity=identity)

    assert len(asked) == 1 and asked[0].startswith("apr_")
    refund = tool_messages(run)["call_refund"]
    assert refund["status"] == "TOOL_STATUS_APPROVAL_REQUIRED"
    assert refund["content"].startswith('TOOL_ERROR: {"errorType":"approval_required"')
    assert asked[0] in refund["content"]
    # The server has the decision: listed as rejected with the approver and reason, and a repeat
    # of the call with that approval is refused with the reason.
    rejected = approvals.ListApprovals(
        pb2.ListApprovalsRequest(state=pb2.APPROVAL_STATE_REJECTED),
        metadata=approver.metadata(),
        timeout=agent_loop.RPC_TIMEOUT_S,
    ).approvals
    mine = [a for a in rejected if a.approval_id == asked[0]]
    assert len(mine) == 1
    assert (mine[0].decided_by, mine[0].reason) == ("dave", "order G-7 was never delivered")
    repeat = pb2_grpc.ToolGateStub(channel).ExecuteTool(
        pb2.ExecuteToolRequest(
            call=pb2.ToolCall(
                call_id="call_refund",
                name="refund_order",
                arguments_json=json.dumps({"order_id": "G-7", "amount_cents": 100}),
                approval_id=asked[0],
            ),
            run_id=run.run_id,
            step=1,
        ),
        metadata=identity.metadata(),
        timeout=agent_loop.RPC_TIMEOUT_S,
    ).result
    assert repeat.status == pb2.TOOL_STATUS_DENIED
    assert repeat.error_type == "approval_rejected"
    assert "order G-7 was never delivered" in repeat.error_message


def test_the_example_runs_as_a_script(toolgate, stubs_dir):
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE_DIR / "agent_loop.py"),
            *("--addr", toolgate.address),
            *("--stubs", str(stubs_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "[bob] approving refund_order" in done.stderr
    # The script prints each transcript message as one indented JSON line.
    transcript = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("  {")]
    refund = [m for m in transcript if m.get("tool_call_id") == "call_refund"]
    assert len(refund) == 1
    assert refund[0]["status"] == "TOOL_STATUS_OK"
    assert '"refunded":"A-1001"' in refund[0]["content"]
