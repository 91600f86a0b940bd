"""The toolgate.v1 contract as an outside client sees it: health, reflection, ListTools, ExecuteTool.

Runs against the real binary serving the embedded demo catalog (see conftest.py). Message types are
built only from server reflection.
"""

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

TOOLGATE = "toolgate.v1.ToolGate"

DEMO_TOOLS = {
    "create_ticket",
    "delete_ticket",
    "echo",
    "query_ticket",
    "rag_search",
    "refund_order",
    "slow_task",
}
SUPPORT_BOT_TOOLS = {"echo", "rag_search", "query_ticket", "create_ticket"}


def list_tools(api, metadata):
    request_cls, call = api.unary(TOOLGATE, "ListTools")
    return call(request_cls(), metadata=metadata)


@pytest.mark.parametrize("service", ["", TOOLGATE])
def test_health_reports_serving(channel, service):
    stub = health_pb2_grpc.HealthStub(channel)
    response = stub.Check(health_pb2.HealthCheckRequest(service=service))
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_toolgate_services(api):
    services = api.services()
    assert TOOLGATE in services
    assert "toolgate.v1.Approvals" in services


def test_list_tools_shows_the_demo_catalog(api, identity):
    response = list_tools(api, identity(tenant="acme"))

    names = [tool.name for tool in response.tools]
    assert set(names) == DEMO_TOOLS
    assert names == sorted(names), "tools are documented as sorted by name"
    assert response.catalog_revision

    rag_search = next(tool for tool in response.tools if tool.name == "rag_search")
    schema = json.loads(rag_search.input_schema_json)
    assert set(schema["properties"]) == {"query", "top_k"}
    assert "filter" not in schema["properties"], "the server-bound filter must be hidden"
    assert "filter" not in schema.get("required", [])


def test_list_tools_hides_tools_denied_to_the_tenant(api, identity):
    response = list_tools(api, identity(tenant="globex"))

    names = {tool.name for tool in response.tools}
    assert "delete_ticket" not in names
    assert names == DEMO_TOOLS - {"delete_ticket"}


def test_list_tools_shows_only_what_the_agent_may_use(api, identity):
    response = list_tools(api, identity(tenant="acme", agent="support-bot"))

    assert {tool.name for tool in response.tools} == SUPPORT_BOT_TOOLS
    assert len(response.tools) == len(SUPPORT_BOT_TOOLS)


def test_catalog_revision_depends_on_what_the_caller_sees(api, identity):
    everything = list_tools(api, identity(tenant="acme"))
    narrower = list_tools(api, identity(tenant="acme", agent="support-bot"))
    again = list_tools(api, identity(tenant="acme"))

    assert everything.catalog_revision == again.catalog_revision
    assert everything.catalog_revision != narrower.catalog_revision


def test_list_tools_without_identity_is_unauthenticated(api):
    with pytest.raises(grpc.RpcError) as raised:
        list_tools(api, metadata=())
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_execute_echo_returns_the_text(api, identity):
    request_cls, call = api.unary(TOOLGATE, "ExecuteTool")
    request = request_cls(run_id="pytest-run", step=1)
    request.call.call_id = "call-1"
    request.call.name = "echo"
    request.call.arguments_json = json.dumps({"text": "hi"})

    response = call(request, metadata=identity(tenant="acme"))

    ok = api.enum_value("toolgate.v1.ToolStatus", "TOOL_STATUS_OK")
    assert ok == 1
    result = response.result
    assert result.status == ok, (result.error_type, result.error_message)
    assert result.model_text == "hi"
    assert result.call_id == "call-1"
