"""toolgate.openai_agents inside the Agents SDK's own loop (`Runner.run`), with a scripted `Model`
instead of an LLM, against the real binary. Tracing is off: nothing leaves the machine."""

from __future__ import annotations

import json
import logging

import pytest
from agents import Agent, FunctionTool, ModelResponse, RunConfig, Runner, set_tracing_disabled
from agents.models.interface import Model
from agents.usage import Usage
from conftest import approver_identity, demo_identity, events_of
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from toolgate import AsyncClient, RiskLevel, ToolDefinition, ToolList
from toolgate.openai_agents import NotStrictError, function_tools, load_function_tools, strict_schema

set_tracing_disabled(True)


def call(call_id: str, name: str, arguments: dict) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, id=f"fc_{call_id}", name=name, arguments=json.dumps(arguments)
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """An Agents SDK Model that answers from a script: each entry is one model response."""

    def __init__(self, responses: list[list]):
        self.responses = list(responses)
        self.shown_tools: list = []
        self.inputs: list = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **_):
        self.shown_tools = list(tools)
        self.inputs.append(input)
        return ModelResponse(output=self.responses.pop(0), usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the tests run the non-streaming loop")


def outputs(result) -> dict[str, str]:
    """Tool outputs by call id, as the SDK fed them back to the model."""
    return {
        item["call_id"]: item["output"]
        for item in result.to_input_list()
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


REFUND = {"order_id": "A-1001", "amount_cents": 2500}


async def test_an_agent_run_with_tenant_binding_and_an_approval_round_trip(toolgate):
    model = ScriptedModel(
        [
            [
                # A strict model sends every property; null for what it leaves out.
                call("s1", "rag_search", {"query": "refund policy", "top_k": None}),
                call("s2", "rag_search", {"query": "refund", "top_k": 1, "filter": {"tenant": "globex"}}),
            ],
            [call("r1", "refund_order", REFUND)],
            [say("The refund is waiting for approval.")],
            [call("r2", "refund_order", REFUND)],
            [say("Refunded.")],
        ]
    )
    async with AsyncClient(toolgate.address, identity=demo_identity()) as client, AsyncClient(
        toolgate.address, identity=approver_identity()
    ) as approver:
        agent = Agent(name="support", instructions="Help.", model=model, tools=await load_function_tools(client))
        conversation = RunConfig(group_id="agents-conv-1", tracing_disabled=True)

        first = await Runner.run(agent, "Order A-1001 arrived broken; refund it.", run_config=conversation)
        shown = {tool.name: tool for tool in model.shown_tools}
        assert all(isinstance(tool, FunctionTool) and tool.strict_json_schema for tool in shown.values())
        rag = shown["rag_search"].params_json_schema
        assert rag["required"] == ["query", "top_k"] and rag["properties"]["top_k"]["type"] == ["integer", "null"]
        assert "filter" not in rag["properties"]

        out = outputs(first)
        hits = json.loads(out["s1"])["results"]
        assert hits and all(hit["id"].startswith("acme-") for hit in hits), "null top_k was dropped, tenant bound"
        assert out["s2"].startswith('TOOL_ERROR: {"errorType":"bound_argument_override"')
        assert out["r1"].startswith('TOOL_ERROR: {"errorType":"approval_required"')
        assert first.final_output == "The refund is waiting for approval."

        [pending] = [a async for a in approver.iter_approvals() if a.run_id == "agents-conv-1"]
        assert pending.approval_id in out["r1"]
        await approver.approve(pending.approval_id, reason="manager ok")

        second = await Runner.run(
            agent, first.to_input_list() + [{"role": "user", "content": "Approved."}], run_config=conversation
        )
    assert json.loads(outputs(second)["r2"]) == {"refunded": "A-1001", "amount_cents": 2500, "status": "refunded"}
    assert second.final_output == "Refunded."

    events = events_of(toolgate, lambda e: e.get("run_id") == "agents-conv-1" and e["kind"] == "tool_call", 4)
    by_call = {e["call_id"]: e for e in events}
    assert set(by_call) == {"s1", "s2", "r1", "r2"}
    assert by_call["s1"]["step"] == 1 and by_call["r1"]["step"] == 2, "step = model responses so far"
    assert by_call["r2"]["approval_id"] == pending.approval_id and by_call["r2"]["status"] == "OK"


def definition(name: str, schema: dict) -> ToolDefinition:
    return ToolDefinition(name=name, version="1", description=name, input_schema=schema, risk_level=RiskLevel.READ_ONLY)


OPEN_SCHEMA = {
    "type": "object",
    "properties": {"labels": {"type": "object", "additionalProperties": {"type": "string"}}},
    "required": ["labels"],
}


def test_a_schema_that_cannot_be_strict_falls_back_to_non_strict_with_a_warning(caplog):
    closed = {"type": "object", "properties": {"a": {"type": "string", "enum": ["x", "y"]}}}
    with caplog.at_level(logging.WARNING, logger="toolgate.openai_agents"):
        tools = function_tools(ToolList((definition("open", OPEN_SCHEMA), definition("closed", closed)), "r"), None)  # type: ignore[arg-type]
    by_name = {tool.name: tool for tool in tools}
    assert not by_name["open"].strict_json_schema
    assert by_name["open"].params_json_schema == OPEN_SCHEMA, "used as it is"
    assert "open: schema cannot be made strict" in caplog.text and "#/properties/labels" in caplog.text
    assert by_name["closed"].strict_json_schema
    assert by_name["closed"].params_json_schema["properties"]["a"] == {"anyOf": [{"type": "string", "enum": ["x", "y"]}, {"type": "null"}]}

    with pytest.raises(NotStrictError):
        function_tools(ToolList((definition("open", OPEN_SCHEMA),), "r"), None, non_strict="raise")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array"},
        {"type": "object", "properties": {"a": {"allOf": [{"type": "string"}]}}},
        {"type": "object", "properties": {}, "patternProperties": {"^x": {}}},
        {"type": "object", "properties": {"a": {"type": "object"}}},
    ],
)
def test_what_strict_mode_cannot_express_is_refused(schema):
    with pytest.raises(NotStrictError):
        strict_schema(schema)
