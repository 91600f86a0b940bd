#!/usr/bin/env python3
"""A small agent loop on the toolgate sidecar, with grpcio and stubs generated from proto/.

It does what an agent runtime does around a model, with the model replaced by a script:

1. `ListTools`: ask the sidecar what the model may see, and turn that into the function
   definitions a model API takes (name, description, JSON Schema parameters).
2. Turn 1: the model proposes several calls at once (echo, rag_search, create_ticket). They go to
   the sidecar in one `ExecuteTools` request with `parallel=True`, and each result's `model_text`
   is appended to the transcript, whatever its status: that text is written for the model.
3. Turn 2: the model proposes `refund_order`. The sidecar answers `TOOL_STATUS_APPROVAL_REQUIRED`
   with an `approval_id`; a second person (subject "bob", scope `toolgate:approve`) approves it
   through the `Approvals` service; the loop repeats the *same* call with that `approval_id`, gets
   OK, and appends the result.

The runtime never decides what is allowed: it sends every proposed call through the sidecar and
hands back what comes out. Who is calling travels in gRPC metadata (here the demo catalog's dev
identity headers; in production an `authorization: Bearer <JWT>`), never in the request body.

The stubs are not checked in; generate them, start the demo sidecar, run the loop:

    examples/python/gen.sh                        # writes examples/python/gen/ (needs grpcio-tools)
    cargo run                                     # the demo catalog on 127.0.0.1:50051
    python examples/python/agent_loop.py --addr 127.0.0.1:50051 [--stubs examples/python/gen]

tests/python/test_agent_loop.py imports this file and runs `run_agent_loop` against the real binary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

# gen.sh's default output directory.
DEFAULT_STUBS_DIR = Path(__file__).resolve().parent / "gen"

# Every RPC gets a deadline: a sidecar that does not answer must not hang the agent.
RPC_TIMEOUT_S = 10.0


def load_stubs(stubs_dir: str | Path | None = None) -> tuple[ModuleType, ModuleType]:
    """Imports the generated `toolgate.v1` modules: (toolgate_pb2, toolgate_pb2_grpc).

    `stubs_dir` is where gen.sh (or `python -m grpc_tools.protoc`) wrote them; it is put on
    sys.path. Without it the modules must already be importable (e.g. via PYTHONPATH).
    """
    if stubs_dir is not None:
        path = str(Path(stubs_dir).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        pb2 = importlib.import_module("toolgate.v1.toolgate_pb2")
        pb2_grpc = importlib.import_module("toolgate.v1.toolgate_pb2_grpc")
    except ImportError as err:
        raise ImportError(
            f"cannot import the generated toolgate.v1 stubs ({err}); run examples/python/gen.sh "
            "and pass its output directory as --stubs"
        ) from err
    return pb2, pb2_grpc


@dataclass(frozen=True)
class Identity:
    """Who is calling. Sent as the demo catalog's dev-identity metadata on every RPC."""

    tenant: str
    subject: str
    agent: str = ""
    scopes: tuple[str, ...] = ()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        # With a JWT-configured sidecar this would be (("authorization", f"Bearer {token}"),).
        return (
            ("x-toolgate-tenant", self.tenant),
            ("x-toolgate-subject", self.subject),
            ("x-toolgate-agent", self.agent),
            ("x-toolgate-scopes", ",".join(self.scopes)),
        )


# The identities of the demo: alice's agent does the work, bob approves what needs approving.
AGENT = Identity(
    tenant="acme",
    subject="alice",
    agent="agent-loop-example",
    scopes=("tickets:read", "tickets:write"),
)
APPROVER = Identity(tenant="acme", subject="bob", scopes=("toolgate:approve",))


@dataclass(frozen=True)
class ProposedCall:
    """One tool call as a model proposes it: an id of its choosing, a tool name, JSON arguments."""

    call_id: str
    name: str
    arguments: dict[str, Any]


class ScriptedModel:
    """Stands in for the LLM: proposes a fixed list of turns, then stops.

    Like a real model it can only call tools it was shown; `next_turn` checks that, so a tool the
    sidecar hid from this caller makes the script fail loudly instead of quietly being refused.
    """

    def __init__(self, turns: Sequence[Sequence[ProposedCall]]):
        self._turns: Iterator[Sequence[ProposedCall]] = iter(turns)

    def next_turn(self, tools: list[dict], transcript: list[dict]) -> Sequence[ProposedCall] | None:
        """The calls of the model's next turn, or None when it is done."""
        del transcript  # a real model reads it; this one follows its script
        calls = next(self._turns, None)
        if calls is None:
            return None
        shown = {tool["name"] for tool in tools}
        for call in calls:
            if call.name not in shown:
                raise RuntimeError(f"the model proposed {call.name!r}, which it was not shown")
        return calls


def demo_model() -> ScriptedModel:
    """The demo conversation: three independent calls at once, then a refund that needs approval."""
    return ScriptedModel(
        [
            [
                ProposedCall("call_echo", "echo", {"text": "Hello from the agent loop"}),
                ProposedCall("call_search", "rag_search", {"query": "refund policy"}),
                ProposedCall(
                    "call_ticket",
                    "create_ticket",
                    {"title": "Refund order A-1001", "body": "Customer asked for a refund."},
                ),
            ],
            [ProposedCall("call_refund", "refund_order", {"order_id": "A-1001", "amount_cents": 2500})],
        ]
    )


def as_model_tool(tool) -> dict:
    """A ToolDefinition as a model API wants a function: name, description, JSON Schema."""
    return {
        "name": tool.name,
        "description": tool.description,
        # Server-bound arguments (e.g. rag_search's tenant filter) are already removed.
        "parameters": json.loads(tool.input_schema_json),
    }


# An approver decides on a pending approval: True approves, False rejects.
Approver = Callable[[str], bool]


def approve_through_approvals_service(
    channel: grpc.Channel,
    stubs: tuple[ModuleType, ModuleType],
    approver: Identity = APPROVER,
    reason: str = "checked with the customer",
) -> Approver:
    """An Approver that approves as `approver` (a second person) through the Approvals service.

    In a real deployment this is a person in a UI; here it reads the pending approval (what a person
    would be shown: tool and canonical arguments) and approves it.
    """
    pb2, pb2_grpc = stubs
    approvals = pb2_grpc.ApprovalsStub(channel)

    def decide(approval_id: str) -> bool:
        pending = approvals.ListApprovals(
            pb2.ListApprovalsRequest(state=pb2.APPROVAL_STATE_PENDING),
            metadata=approver.metadata(),
            timeout=RPC_TIMEOUT_S,
        )
        approval = next((a for a in pending.approvals if a.approval_id == approval_id), None)
        if approval is None:
            raise RuntimeError(f"approval {approval_id} is not pending for {approver.subject}")
        print(
            f"[{approver.subject}] approving {approval.tool} {approval.arguments_json} "
            f"requested by {approval.subject}",
            file=sys.stderr,
        )
        decided = approvals.DecideApproval(
            pb2.DecideApprovalRequest(
                approval_id=approval_id,
                decision=pb2.APPROVAL_DECISION_APPROVE,
                reason=reason,
            ),
            metadata=approver.metadata(),
            timeout=RPC_TIMEOUT_S,
        )
        return decided.approval.state == pb2.APPROVAL_STATE_APPROVED

    return decide


@dataclass
class AgentRun:
    """What one run of the loop produced."""

    run_id: str
    catalog_revision: str
    tools: list[dict]
    transcript: list[dict] = field(default_factory=list)


def run_agent_loop(
    channel: grpc.Channel,
    stubs: tuple[ModuleType, ModuleType],
    approver: Approver,
    model: ScriptedModel | None = None,
    identity: Identity = AGENT,
    task: str = "Order A-1001 arrived broken; the customer wants a refund of 25 dollars.",
    run_id: str | None = None,
) -> AgentRun:
    """Runs the model's turns through the sidecar and returns the transcript.

    The transcript is a list of chat messages in the usual shape: the user's task, an assistant
    message with the proposed `tool_calls` per turn, and one `tool` message per call whose content
    is the sidecar's `model_text`.
    """
    pb2, pb2_grpc = stubs
    toolgate = pb2_grpc.ToolGateStub(channel)
    metadata = identity.metadata()
    model = model or demo_model()

    # 1. What may the model see? Only what ListTools returns for this caller.
    listed = toolgate.ListTools(pb2.ListToolsRequest(), metadata=metadata, timeout=RPC_TIMEOUT_S)
    run = AgentRun(
        run_id=run_id or f"run-{uuid.uuid4().hex[:12]}",
        catalog_revision=listed.catalog_revision,
        tools=[as_model_tool(tool) for tool in listed.tools],
    )
    run.transcript.append({"role": "user", "content": task})

    step = 0
    while (proposed := model.next_turn(run.tools, run.transcript)) is not None:
        step += 1
        run.transcript.append(
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": c.call_id, "name": c.name, "arguments": json.dumps(c.arguments)}
                    for c in proposed
                ],
            }
        )
        calls = [
            pb2.ToolCall(call_id=c.call_id, name=c.name, arguments_json=json.dumps(c.arguments))
            for c in proposed
        ]

        # 2. One request per model turn. The sidecar decides each call on its own; a refusal is a
        #    ToolResult (never a gRPC error), and results come back in the order of `calls`.
        response = toolgate.ExecuteTools(
            pb2.ExecuteToolsRequest(
                calls=calls,
                run_id=run.run_id,
                step=step,
                parallel=True,
                # The revision the model was shown: a tool that changed since is refused as stale.
                catalog_revision=run.catalog_revision,
            ),
            metadata=metadata,
            timeout=RPC_TIMEOUT_S,
        )

        for call, result in zip(calls, response.results):
            # 3. A risky call waits for a second person, then is repeated unchanged (same caller,
            #    run and arguments: the approval is bound to them) with the approval_id.
            if result.status == pb2.TOOL_STATUS_APPROVAL_REQUIRED and approver(result.approval_id):
                retry = pb2.ToolCall()
                retry.CopyFrom(call)
                retry.approval_id = result.approval_id
                result = toolgate.ExecuteTool(
                    pb2.ExecuteToolRequest(
                        call=retry,
                        run_id=run.run_id,
                        step=step,
                        catalog_revision=run.catalog_revision,
                    ),
                    metadata=metadata,
                    timeout=RPC_TIMEOUT_S,
                ).result

            # model_text is exactly what goes back to the model, on success and on refusal alike.
            run.transcript.append(
                {
                    "role": "tool",
                    "tool_call_id": result.call_id,
                    "name": call.name,
                    "status": pb2.ToolStatus.Name(result.status),
                    "content": result.model_text,
                }
            )
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", default="127.0.0.1:50051", help="the sidecar's host:port")
    parser.add_argument(
        "--stubs",
        default=str(DEFAULT_STUBS_DIR),
        help="directory holding the generated toolgate/v1/*_pb2*.py (gen.sh's output)",
    )
    args = parser.parse_args(argv)

    stubs = load_stubs(args.stubs)
    with grpc.insecure_channel(args.addr) as channel:
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_S)
        run = run_agent_loop(channel, stubs, approve_through_approvals_service(channel, stubs))

    print(f"run {run.run_id}, catalog revision {run.catalog_revision}")
    print("tools shown to the model:")
    for tool in run.tools:
        print(f"  {tool['name']}: {json.dumps(tool['parameters'])}")
    print("transcript:")
    for message in run.transcript:
        print(f"  {json.dumps(message)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
