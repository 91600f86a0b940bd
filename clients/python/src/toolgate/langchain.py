"""LangChain adapter: toolgate's tools as LangChain `StructuredTool`s.

    from toolgate import Client, DevIdentity
    from toolgate.langchain import load_tools

    tools = load_tools(Client(identity=DevIdentity(tenant="acme")))
    agent = langchain.agents.create_agent(model, tools)

- Name, description and args schema come from ListTools (the visible JSON Schema, bound arguments
  already removed). Names with characters model APIs refuse (e.g. dots) get `_` instead.
- Every invocation goes through ExecuteTool with the catalog revision the tools were built from.
  The tool message's content is the result's `model_text`, on success and refusal alike: a
  refusal (approval required included) is a message the model reads, with `status="error"`, never
  an exception. The message's `artifact` holds the result's status, error type and approval id.
  Transport failures (sidecar down, deadline) raise `toolgate.TransportError`.
- The framework's tool call id becomes the toolgate call id. The run id is `run_id=` if given,
  else the LangGraph `thread_id` of the invocation, else one id fixed for this toolset; the step is
  LangGraph's `langgraph_step`.
- Approval round trip: after a person approved, the model repeats the call (same arguments, same
  run) and the tool redeems the approval it remembered (see toolgate._adapter).

Tools built from a `Client` work with `invoke` and `ainvoke`; from an `AsyncClient`, `ainvoke` only.
Needs `langchain-core` (the `toolgate-client[langchain]` extra).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import ConfigDict

from toolgate._adapter import ApprovalMemory, model_tool_names, parse_arguments, result_summary
from toolgate.client import AsyncClient, Client
from toolgate.models import ToolCall, ToolDefinition, ToolList, ToolResult


class ToolgateTool(StructuredTool):
    """One toolgate tool as a LangChain tool; calls go through the sidecar."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    definition: ToolDefinition
    client: Any  # Client or AsyncClient
    catalog_revision: str = ""
    run_id: str = ""
    default_run_id: str = ""
    call_timeout: float | None = None
    memory: ApprovalMemory

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The model's arguments stay one dict: a property called `config` or `callbacks` must not
        # collide with what LangChain injects, and the sidecar validates them, not pydantic.
        return (tool_input, tool_call_id), {}

    def _context(self, config: RunnableConfig | None) -> tuple[str, int]:
        config = config or {}
        configurable = config.get("configurable") or {}
        metadata = config.get("metadata") or {}
        run_id = self.run_id or str(configurable.get("thread_id") or "") or self.default_run_id
        step = metadata.get("langgraph_step", 0)
        return run_id, step if isinstance(step, int) and step >= 0 else 0

    def _call(self, arguments: Any, tool_call_id: str | None, config: RunnableConfig | None) -> tuple[ToolCall, str, int, str]:
        run_id, step = self._context(config)
        parsed = parse_arguments(arguments)
        key = ApprovalMemory.key(run_id, self.definition.name, parsed)
        call = ToolCall(
            name=self.definition.name,
            arguments=parsed if isinstance(parsed, dict) else str(arguments),
            call_id=tool_call_id or "",
            approval_id=self.memory.approval_for(key),
        )
        return call, run_id, step, key

    def _output(self, result: ToolResult, tool_call_id: str | None, key: str) -> Any:
        self.memory.record(key, result)
        if not tool_call_id:
            return result.model_text
        return ToolMessage(
            content=result.model_text,
            tool_call_id=tool_call_id,
            name=self.name,
            status="success" if result.ok else "error",
            artifact=result_summary(result),
        )

    def _run(self, arguments: Any, tool_call_id: str | None, *, config: RunnableConfig, run_manager: Any = None) -> Any:
        if isinstance(self.client, AsyncClient):
            raise NotImplementedError(f"{self.name} was built from an AsyncClient: use ainvoke")
        call, run_id, step, key = self._call(arguments, tool_call_id, config)
        result = self.client.execute(
            call, run_id=run_id, step=step, catalog_revision=self.catalog_revision, timeout=self.call_timeout
        )
        return self._output(result, tool_call_id, key)

    async def _arun(
        self, arguments: Any, tool_call_id: str | None, *, config: RunnableConfig, run_manager: Any = None
    ) -> Any:
        call, run_id, step, key = self._call(arguments, tool_call_id, config)
        options = {"run_id": run_id, "step": step, "catalog_revision": self.catalog_revision, "timeout": self.call_timeout}
        if isinstance(self.client, AsyncClient):
            result = await self.client.execute(call, **options)
        else:
            result = await asyncio.to_thread(self.client.execute, call, **options)
        return self._output(result, tool_call_id, key)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        # StructuredTool.ainvoke runs the sync path in a thread when it has no coroutine; ours has _arun.
        return await BaseTool.ainvoke(self, input, config, **kwargs)


def build_tools(
    tools: ToolList,
    client: Client | AsyncClient,
    *,
    run_id: str = "",
    timeout: float | None = None,
    names: set[str] | None = None,
) -> list[ToolgateTool]:
    """LangChain tools for `tools` (a ListTools answer), calling through `client`."""
    memory = ApprovalMemory()
    default_run_id = f"langchain-{uuid.uuid4().hex[:16]}"
    return [
        ToolgateTool(
            name=model_name,
            description=definition.description,
            args_schema=dict(definition.input_schema),
            definition=definition,
            client=client,
            catalog_revision=tools.catalog_revision,
            run_id=run_id,
            default_run_id=default_run_id,
            call_timeout=timeout,
            memory=memory,
        )
        for model_name, definition in model_tool_names(tools).items()
        if names is None or definition.name in names
    ]


def load_tools(client: Client, **options: Any) -> list[ToolgateTool]:
    """ListTools, then `build_tools`. Options: run_id, timeout, names."""
    return build_tools(client.list_tools(timeout=options.get("timeout")), client, **options)


async def aload_tools(client: AsyncClient, **options: Any) -> list[ToolgateTool]:
    """`load_tools` for an AsyncClient."""
    return build_tools(await client.list_tools(timeout=options.get("timeout")), client, **options)
