"""OpenAI Agents SDK adapter: toolgate's tools as `FunctionTool`s.

    from toolgate import AsyncClient, DevIdentity
    from toolgate.openai_agents import load_function_tools

    tools = await load_function_tools(AsyncClient(identity=DevIdentity(tenant="acme")))
    agent = agents.Agent(name="support", tools=tools)

Strict schemas. The SDK (and OpenAI's strict function calling) wants every object closed
(`additionalProperties: false`) with every property listed in `required`. toolgate's visible schema
is rewritten to that form: each optional property becomes required but nullable (`["integer",
"null"]`, or `anyOf [..., {"type": "null"}]`), and a `null` the model sends for a property that was
optional is dropped before the call goes to the sidecar, so the tool sees what its own schema
expects. Value keywords (`minLength`, `pattern`, `maximum`, ...) are kept; the sidecar checks them
again in any case. A schema that cannot be made strict without changing what it accepts (an
object open to undeclared properties, `patternProperties`, `allOf`/`not`/`if` combinations, a root
that is not an object) is used as it is with `strict_json_schema=False` and a warning is logged
(logger `toolgate.openai_agents`); pass `non_strict="raise"` to refuse such tools instead. Either
way the sidecar validates every call against the tool's real schema.

Calls: every invocation goes through ExecuteTool with the tool call id as toolgate's call id, the
catalog revision the tools were built from, the run id (`run_id=` if given, else the run's
`RunConfig.group_id`, else one id fixed for this toolset) and the step (model responses so far in
the run, `usage.requests`). The result's `model_text` is the tool output the model reads, for
refusals too (approval required included): never an exception. Transport failures raise
`toolgate.TransportError`, which fails the run. Approval round trips work as in
`toolgate.langchain`: the repeated call redeems the approval the toolset remembered.

Needs `openai-agents` (the `toolgate-client[openai-agents]` extra).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import uuid
from typing import Any, Literal

from agents import FunctionTool, RunContextWrapper
from agents.exceptions import UserError
from agents.tool_context import ToolContext

from toolgate._adapter import ApprovalMemory, model_tool_names, parse_arguments
from toolgate.client import AsyncClient, Client
from toolgate.models import ToolCall, ToolDefinition, ToolList

logger = logging.getLogger("toolgate.openai_agents")

# Keywords whose meaning strict mode cannot keep: a schema using them is not made strict.
_NOT_STRICT = ("patternProperties", "propertyNames", "allOf", "not", "if", "then", "else",
               "dependentRequired", "dependentSchemas", "unevaluatedProperties", "$ref", "$dynamicRef")


class NotStrictError(ValueError):
    """A tool's schema cannot be made strict (raised only with `non_strict="raise"`)."""


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The strict form of a visible toolgate schema; raises NotStrictError when there is none."""
    if schema.get("type") != "object":
        raise NotStrictError("the root is not an object")
    return _strict(copy.deepcopy(schema), "#")


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node


def _strict(node: Any, at: str) -> Any:
    if not isinstance(node, dict):
        raise NotStrictError(f"{at} is not a schema object")
    for keyword in _NOT_STRICT:
        if keyword in node:
            raise NotStrictError(f"{at} uses {keyword}")
    if _is_object(node):
        properties = node.get("properties")
        if not isinstance(properties, dict) or not properties:
            raise NotStrictError(f"{at} is an object without declared properties")
        if node.get("additionalProperties", False) is not False:
            raise NotStrictError(f"{at} allows undeclared properties")
        required = set(node.get("required", []))
        node["additionalProperties"] = False
        node["properties"] = {
            name: _strict(sub, f"{at}/properties/{name}") if name in required else _nullable(_strict(sub, f"{at}/properties/{name}"))
            for name, sub in properties.items()
        }
        node["required"] = list(properties)
    if isinstance(node.get("items"), dict):
        node["items"] = _strict(node["items"], f"{at}/items")
    for union in ("anyOf", "oneOf"):
        if isinstance(node.get(union), list):
            node[union] = [_strict(sub, f"{at}/{union}/{i}") for i, sub in enumerate(node[union])]
    return node


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    if isinstance(kind, str) and "enum" not in node and "const" not in node:
        return {**node, "type": [kind, "null"]}
    if isinstance(kind, list) and "enum" not in node and "const" not in node:
        return node if "null" in kind else {**node, "type": [*kind, "null"]}
    return {"anyOf": [node, {"type": "null"}]}


def drop_optional_nulls(arguments: Any, schema: dict[str, Any]) -> Any:
    """Removes the nulls a strict model sends for properties the original schema left optional."""
    if not isinstance(arguments, dict) or not isinstance(schema, dict):
        return arguments
    properties = schema.get("properties") or {}
    required = set(schema.get("required", []))
    cleaned = {}
    for name, value in arguments.items():
        if value is None and name in properties and name not in required:
            continue
        sub = properties.get(name)
        if isinstance(sub, dict) and isinstance(value, dict):
            value = drop_optional_nulls(value, sub)
        elif isinstance(sub, dict) and isinstance(value, list) and isinstance(sub.get("items"), dict):
            value = [drop_optional_nulls(item, sub["items"]) for item in value]
        cleaned[name] = value
    return cleaned


class _Invoker:
    """The on_invoke_tool of one tool: the model's JSON through ExecuteTool, model_text back."""

    def __init__(self, definition: ToolDefinition, client: Client | AsyncClient, catalog_revision: str,
                 run_id: str, default_run_id: str, timeout: float | None, memory: ApprovalMemory, strict: bool):
        self.definition = definition
        self.client = client
        self.catalog_revision = catalog_revision
        self.run_id = run_id
        self.default_run_id = default_run_id
        self.timeout = timeout
        self.memory = memory
        self.strict = strict

    def _context(self, ctx: RunContextWrapper[Any]) -> tuple[str, int]:
        run_config = getattr(ctx, "run_config", None)
        group_id = getattr(run_config, "group_id", None) if run_config is not None else None
        requests = getattr(getattr(ctx, "usage", None), "requests", 0)
        return self.run_id or group_id or self.default_run_id, requests if isinstance(requests, int) else 0

    async def __call__(self, ctx: ToolContext[Any], raw_arguments: str) -> str:
        run_id, step = self._context(ctx)
        parsed = parse_arguments(raw_arguments)
        if self.strict:
            parsed = drop_optional_nulls(parsed, dict(self.definition.input_schema))
        key = ApprovalMemory.key(run_id, self.definition.name, parsed)
        call = ToolCall(
            name=self.definition.name,
            arguments=parsed if isinstance(parsed, dict) else raw_arguments,
            call_id=getattr(ctx, "tool_call_id", "") or "",
            approval_id=self.memory.approval_for(key),
        )
        options = {"run_id": run_id, "step": step, "catalog_revision": self.catalog_revision, "timeout": self.timeout}
        if isinstance(self.client, AsyncClient):
            result = await self.client.execute(call, **options)
        else:
            result = await asyncio.to_thread(self.client.execute, call, **options)
        self.memory.record(key, result)
        return result.model_text


def function_tools(
    tools: ToolList,
    client: Client | AsyncClient,
    *,
    run_id: str = "",
    timeout: float | None = None,
    names: set[str] | None = None,
    non_strict: Literal["fallback", "raise"] = "fallback",
) -> list[FunctionTool]:
    """Agents SDK FunctionTools for `tools` (a ListTools answer), calling through `client`."""
    memory = ApprovalMemory()
    default_run_id = f"agents-{uuid.uuid4().hex[:16]}"
    built = []
    for model_name, definition in model_tool_names(tools).items():
        if names is not None and definition.name not in names:
            continue
        visible = dict(definition.input_schema)
        try:
            params, strict = strict_schema(visible), True
            # The SDK's own check, so a schema it would refuse falls back here rather than failing later.
            FunctionTool(name=model_name, description="", params_json_schema=params,
                         on_invoke_tool=_never_called, strict_json_schema=True)
        except (NotStrictError, UserError) as err:
            if non_strict == "raise":
                raise NotStrictError(f"tool {definition.name}: {err}") from err
            logger.warning("tool %s: schema cannot be made strict (%s); using it non-strict", definition.name, err)
            params, strict = visible, False
        invoker = _Invoker(definition, client, tools.catalog_revision, run_id, default_run_id, timeout, memory, strict)
        built.append(
            FunctionTool(
                name=model_name,
                description=definition.description,
                params_json_schema=params,
                on_invoke_tool=invoker,
                strict_json_schema=strict,
            )
        )
    return built


async def _never_called(ctx: ToolContext[Any], arguments: str) -> str:
    raise AssertionError("only used to check a schema")


async def load_function_tools(client: Client | AsyncClient, **options: Any) -> list[FunctionTool]:
    """ListTools, then `function_tools`. Options: run_id, timeout, names, non_strict."""
    if isinstance(client, AsyncClient):
        listed = await client.list_tools(timeout=options.get("timeout"))
    else:
        listed = await asyncio.to_thread(client.list_tools, timeout=options.get("timeout"))
    return function_tools(listed, client, **options)
