"""toolgate.langchain inside LangChain's own agent loop (`langchain.agents.create_agent`, LangGraph),
with a scripted fake chat model instead of an LLM, against the real binary."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import approver_identity, demo_identity, events_of
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

from toolgate import AsyncClient, Client, RiskLevel, ToolDefinition, ToolList
from toolgate.langchain import ToolgateTool, aload_tools, build_tools, load_tools


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's fake chat model, answering from a script; bind_tools records what it was shown."""

    shown: list[dict] = []

    def bind_tools(self, tools, **kwargs):
        self.shown[:] = [convert_to_openai_tool(tool)["function"] for tool in tools]
        return self


def turn(*calls: tuple[str, str, dict]) -> AIMessage:
    """One model turn proposing tool calls: (call id, tool, arguments)."""
    return AIMessage(content="", tool_calls=[{"id": i, "name": n, "args": a} for i, n, a in calls])


def script(*messages: AIMessage) -> Iterator[AIMessage]:
    return iter(messages)


def tool_messages(state) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}


REFUND = {"order_id": "A-1001", "amount_cents": 2500}


def test_an_agent_loop_with_tenant_binding_and_an_approval_round_trip(toolgate, make_client):
    client = make_client()
    approver = make_client(identity=approver_identity())
    model = ScriptedChatModel(
        messages=script(
            turn(
                ("c_search", "rag_search", {"query": "refund policy"}),
                ("c_attack", "rag_search", {"query": "refund", "filter": {"tenant": "globex"}}),
            ),
            turn(("c_refund", "refund_order", REFUND)),
            AIMessage(content="The refund needs a manager's approval."),
            turn(("c_refund_again", "refund_order", REFUND)),
            AIMessage(content="Refunded."),
        )
    )
    agent = create_agent(model, load_tools(client), checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "lc-thread-1"}}

    state = agent.invoke({"messages": [HumanMessage("Order A-1001 arrived broken; refund it.")]}, thread)
    shown = {tool["name"]: tool for tool in model.shown}
    assert "filter" not in shown["rag_search"]["parameters"]["properties"], "bound arguments are hidden"
    assert shown["refund_order"]["parameters"]["required"] == ["order_id", "amount_cents"]

    messages = tool_messages(state)
    search = messages["c_search"]
    assert search.status == "success"
    hits = json.loads(search.content)["results"]
    assert hits and all(hit["id"].startswith("acme-") for hit in hits)
    attack = messages["c_attack"]
    assert attack.status == "error"
    assert attack.content.startswith('TOOL_ERROR: {"errorType":"bound_argument_override"')
    refund = messages["c_refund"]
    assert refund.status == "error" and refund.artifact["status"] == "APPROVAL_REQUIRED"
    approval_id = refund.artifact["approval_id"]
    assert approval_id in refund.content, "the model reads why the call did not run"
    assert state["messages"][-1].content == "The refund needs a manager's approval."

    # A person approves out of band; the conversation goes on in the same thread (the same run).
    approver.approve(approval_id, reason="manager ok")
    state = agent.invoke({"messages": [HumanMessage("Approved, go ahead.")]}, thread)
    done = tool_messages(state)["c_refund_again"]
    assert done.status == "success", done
    assert json.loads(done.content) == {"refunded": "A-1001", "amount_cents": 2500, "status": "refunded"}
    assert state["messages"][-1].content == "Refunded."

    # The sidecar saw LangChain's call ids, the thread as the run and LangGraph's steps.
    events = events_of(toolgate, lambda e: e.get("run_id") == "lc-thread-1" and e["kind"] == "tool_call", 4)
    by_call = {e["call_id"]: e for e in events}
    assert set(by_call) == {"c_search", "c_attack", "c_refund", "c_refund_again"}
    assert by_call["c_search"]["step"] == by_call["c_attack"]["step"] > 0
    assert by_call["c_refund"]["step"] > by_call["c_search"]["step"]
    assert by_call["c_refund_again"]["approval_id"] == approval_id
    assert by_call["c_refund_again"]["status"] == "OK"


async def test_the_async_loop_with_an_async_client(toolgate):
    async with AsyncClient(toolgate.address, identity=demo_identity(tenant="globex")) as client:
        model = ScriptedChatModel(
            messages=script(
                turn(("a1", "rag_search", {"query": "refund policy", "top_k": 2}), ("a2", "echo", {"text": "hi"})),
                AIMessage(content="done"),
            )
        )
        agent = create_agent(model, await aload_tools(client, run_id="lc-async-run"))
        state = await agent.ainvoke({"messages": [HumanMessage("What is our refund policy?")]})
    messages = tool_messages(state)
    hits = json.loads(messages["a1"].content)["results"]
    assert hits and all(hit["id"].startswith("globex-") for hit in hits)
    assert messages["a2"].content == "hi"
    events = events_of(toolgate, lambda e: e.get("run_id") == "lc-async-run", 2)
    assert {e["call_id"] for e in events} == {"a1", "a2"}


def test_a_tool_invoked_without_a_tool_call_returns_the_text(client):
    [echo] = load_tools(client, names={"echo"})
    assert echo.invoke({"text": "plain"}) == "plain"
    assert echo.invoke({"config": "x"}).startswith('TOOL_ERROR: {"errorType":"schema_violation"'), (
        "a property named like a LangChain keyword still reaches the sidecar"
    )


async def test_tools_from_an_async_client_refuse_the_sync_path(aclient):
    [echo] = await aload_tools(aclient, names={"echo"})
    assert await echo.ainvoke({"text": "async"}) == "async"
    with pytest.raises(NotImplementedError):
        echo.invoke({"text": "sync"})


def test_names_a_model_api_refuses_are_rewritten():
    definition = ToolDefinition(
        name="time.get_current_time",
        version="1",
        description="now",
        input_schema={"type": "object", "properties": {}},
        risk_level=RiskLevel.READ_ONLY,
    )
    [tool] = build_tools(ToolList((definition,), "rev"), client=None)  # type: ignore[arg-type]
    assert isinstance(tool, ToolgateTool)
    assert tool.name == "time_get_current_time" and tool.definition.name == "time.get_current_time"
    with pytest.raises(ValueError):
        build_tools(ToolList((definition, ToolDefinition(**{**definition.__dict__, "name": "time_get_current_time"})), "rev"), None)  # type: ignore[arg-type]
