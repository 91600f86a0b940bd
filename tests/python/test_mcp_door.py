"""The MCP door, black-box, with the official Python MCP SDK (`mcp` on PyPI) as the host.

Each test runs against the real binary serving the demo catalog (its `server.mcp` door, with an
approvals URL added so 2026-07-28 hosts get approvals as URL elicitations), or, for identity,
a catalog verifying JWTs as an OAuth resource server. The gRPC Approvals service is the second
person who decides approvals. Both spec revisions are driven: `mode="auto"` negotiates 2026-07-28
through `server/discover`, `mode="legacy"` the 2025-11-25 initialize handshake.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpx2
import jwt
import pytest
import toolgate_process
from conftest import DEFAULT_RPC_DEADLINE_S, ReflectedApi, _identity
from mcp import Client
from mcp import types as mcp_types
from mcp.client.streamable_http import streamable_http_client

import grpc

APPROVALS_URL = "https://approvals.example/approve/{approval_id}"
BOTH_REVISIONS = pytest.mark.parametrize(
    ("mode", "revision"), [("auto", "2026-07-28"), ("legacy", "2025-11-25")], ids=["2026-07-28", "2025-11-25"]
)
ACCEPT = "application/json, text/event-stream"


def _demo_with_approvals_url(tmp: Path) -> Path:
    text = (toolgate_process.REPO_ROOT / "examples" / "demo.yaml").read_text()
    # The approval tests call refund_order more often than its 5/min.
    text = text.replace("rate_limit: 5/min", "rate_limit: 600/min", 1)
    # The cancellation tests hold slow_task open until they cancel it: only a cancel ends it early.
    assert text.count("timeout: 1000ms") == 1, "slow_task's timeout moved; update this test"
    text = text.replace("timeout: 1000ms", "timeout: 60s", 1)
    marker = "    path: /mcp\n"
    assert marker in text, "the demo's server.mcp section moved; update this test"
    path = tmp / "demo-mcp.yaml"
    path.write_text(text.replace(marker, f'{marker}    approvals_url: "{APPROVALS_URL}"\n', 1))
    return path


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """The demo catalog's MCP door (and its gRPC door, for the second person and for parity)."""
    config = _demo_with_approvals_url(tmp_path_factory.mktemp("mcp"))
    server = toolgate_process.start(args=("--config", str(config)))
    assert server.mcp_address, f"no MCP door in the log:\n{server.stderr_text()}"
    yield server
    code = toolgate_process.stop(server)
    assert code == 0, f"toolgate exited with {code}; stderr:\n{server.stderr_text()}"


@pytest.fixture(scope="module")
def grpc_api(door) -> ReflectedApi:
    channel = grpc.insecure_channel(door.address)
    grpc.channel_ready_future(channel).result(timeout=DEFAULT_RPC_DEADLINE_S)
    with channel:
        yield ReflectedApi(channel)


def url(server) -> str:
    return f"http://{server.mcp_address}/mcp"


def dev_headers(tenant="acme", subject="alice", agent="pytest-agent", scopes=("tickets:read",)) -> dict:
    return {
        "x-toolgate-tenant": tenant,
        "x-toolgate-subject": subject,
        "x-toolgate-agent": agent,
        "x-toolgate-scopes": ",".join(scopes),
    }


def host(server, mode: str, headers: dict | None = None, **kwargs) -> Client:
    """The SDK's high-level client on the door, identified by `headers` (dev identity by default)."""
    http = httpx2.AsyncClient(headers=headers if headers is not None else dev_headers(), timeout=30)
    return Client(streamable_http_client(url(server), http_client=http), mode=mode, cache=None, **kwargs)


def run(test):
    """Runs an async test body with a bound on its whole duration."""

    async def bounded():
        with anyio.fail_after(60):
            return await test()

    return anyio.run(bounded)


def grpc_list_tools(api: ReflectedApi, metadata) -> tuple[list[str], str]:
    request_cls, call = api.unary("toolgate.v1.ToolGate", "ListTools")
    response = call(request_cls(), metadata=metadata, timeout=DEFAULT_RPC_DEADLINE_S)
    return sorted(t.name for t in response.tools), response.catalog_revision


def decide(api: ReflectedApi, approval_id: str, approve: bool = True, tenant: str = "acme"):
    """The second person (bob, with toolgate:approve) decides through the gRPC Approvals service."""
    request_cls, call = api.unary("toolgate.v1.Approvals", "DecideApproval")
    decision = "APPROVAL_DECISION_APPROVE" if approve else "APPROVAL_DECISION_REJECT"
    return call(
        request_cls(
            approval_id=approval_id,
            decision=api.enum_value("toolgate.v1.ApprovalDecision", decision),
            reason="checked by pytest",
        ),
        metadata=_identity(tenant=tenant, subject="bob", scopes=("toolgate:approve",)),
        timeout=DEFAULT_RPC_DEADLINE_S,
    )


def tool_error(result) -> dict:
    """The TOOL_ERROR body of a refused call's text."""
    text = result.content[0].text
    assert text.startswith("TOOL_ERROR: "), text
    return json.loads(text.removeprefix("TOOL_ERROR: "))


# --- what a host sees -----------------------------------------------------------------------------


@BOTH_REVISIONS
def test_tools_list_is_list_tools_for_this_caller(door, grpc_api, mode, revision):
    async def body():
        async with host(door, mode) as client:
            assert client.protocol_version == revision
            listed = await client.list_tools()
        return listed

    listed = run(body)
    names = sorted(t.name for t in listed.tools)
    grpc_names, grpc_revision = grpc_list_tools(grpc_api, _identity(subject="alice", scopes=("tickets:read",)))
    assert names == grpc_names
    assert listed.meta["toolgate/catalog_revision"] == grpc_revision
    by_name = {t.name: t for t in listed.tools}
    # Bound parameters are not shown: the tenant comes from the caller, never from the model.
    assert "tenant" not in by_name["query_ticket"].input_schema["properties"]
    assert "tenant" not in json.dumps(by_name["rag_search"].input_schema)
    assert by_name["echo"].annotations.read_only_hint is True
    # One caller's list is not another's.
    if revision == "2026-07-28":
        assert listed.cache_scope == "private"


def test_a_tenant_sees_what_its_rules_allow(door):
    async def body():
        async with host(door, "auto", dev_headers(tenant="globex", scopes=("tickets:read", "tickets:write"))) as c:
            return sorted(t.name for t in (await c.list_tools()).tools)

    names = run(body)
    assert "delete_ticket" not in names and "create_ticket" in names


@BOTH_REVISIONS
def test_a_call_runs_and_a_refusal_is_a_tool_result(door, mode, revision):
    async def body():
        async with host(door, mode) as client:
            ok = await client.call_tool("echo", {"text": "hello from the host"})
            refused = await client.call_tool("echo", {"text": 42})
        return ok, refused

    ok, refused = run(body)
    assert ok.is_error is False and ok.content[0].text == "hello from the host"
    assert ok.meta["toolgate/status"] == "OK"
    assert refused.is_error is True
    error = tool_error(refused)
    assert error["errorType"] == "schema_violation" and error["tool"] == "echo"
    assert refused.meta["toolgate/error_type"] == "schema_violation"
    assert refused.meta["toolgate/refused_by"] == "schema"


def test_the_model_cannot_choose_the_rag_tenant(door):
    async def body():
        async with host(door, "auto") as client:
            own = await client.call_tool("rag_search", {"query": "refund policy"})
            other = await client.call_tool("rag_search", {"query": "refund policy", "filter": {"tenant": "globex"}})
        return own, other

    own, other = run(body)
    assert own.is_error is False, own.content[0].text
    assert "acme" in own.content[0].text and "globex" not in own.content[0].text
    assert other.is_error is True
    assert tool_error(other)["errorType"] == "bound_argument_override"
    events = door.wait_for_audit_events(
        lambda evs: any(e.get("tool") == "rag_search" and e.get("bound_override_attempts") for e in evs)
    )
    attempt = next(e for e in events if e.get("tool") == "rag_search" and e.get("bound_override_attempts"))
    assert attempt["door"] == "mcp" and attempt["tenant"] == "acme"


@pytest.mark.parametrize(
    ("headers", "hidden"),
    [
        pytest.param(dev_headers(agent="support-bot", scopes=("tickets:write",)), "delete_ticket", id="agent rule"),
        pytest.param(dev_headers(tenant="globex", scopes=("tickets:write",)), "delete_ticket", id="tenant rule"),
        pytest.param(dev_headers(scopes=()), "create_ticket", id="missing scope"),
    ],
)
def test_a_hidden_tool_answers_as_a_tool_that_does_not_exist(door, headers, hidden):
    async def body():
        async with host(door, "auto", headers) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            refused = await client.call_tool(hidden, {"ticket_id": "T-1"}, meta={"toolgate/run_id": "r"})
            missing = await client.call_tool("no_such_tool", {"ticket_id": "T-1"}, meta={"toolgate/run_id": "r"})
        return names, refused, missing

    names, refused, missing = run(body)
    assert hidden not in names
    refused_error, missing_error = tool_error(refused), tool_error(missing)
    assert refused_error["errorType"] == missing_error["errorType"] == "tool_not_found"
    assert refused_error["error"].replace(hidden, "X") == missing_error["error"].replace("no_such_tool", "X")
    assert refused.meta == missing.meta
    # The record says why.
    events = door.wait_for_audit_events(
        lambda evs: any(e.get("tool") == hidden and "hidden from this caller" in e.get("reason", "") for e in evs)
    )
    assert any(e.get("tool") == hidden and e["door"] == "mcp" for e in events)


def test_each_call_is_audited_with_the_door_and_the_meta_keys(door):
    async def body():
        async with host(door, "auto") as client:
            return await client.call_tool(
                "echo", {"text": "audited"}, meta={"toolgate/run_id": "run-mcp-1", "toolgate/step": 4}
            )

    result = run(body)
    assert result.is_error is False
    events = door.wait_for_audit_events(lambda evs: any(e.get("run_id") == "run-mcp-1" for e in evs))
    event = next(e for e in events if e.get("run_id") == "run-mcp-1")
    assert event["door"] == "mcp" and event["step"] == 4 and event["tool"] == "echo"
    assert event["tenant"] == "acme" and event["subject"] == "alice" and event["status"] == "OK"


# --- approvals ------------------------------------------------------------------------------------


def test_approval_round_trip_2026_07_28_as_a_url_elicitation(door, grpc_api):
    """The host is asked, through a URL elicitation, to have a person decide; the retry, echoing
    the sealed requestState, redeems the approval once it is approved."""
    asked = []

    async def approve_when_asked(context, params):
        assert params.mode == "url", params
        approval_id = params.url.rsplit("/", 1)[-1]
        assert params.url == APPROVALS_URL.replace("{approval_id}", approval_id)
        asked.append(approval_id)
        # The person is someone else, deciding through the Approvals service.
        await anyio.to_thread.run_sync(decide, grpc_api, approval_id)
        return mcp_types.ElicitResult(action="accept")

    async def body():
        async with host(door, "auto", elicitation_callback=approve_when_asked) as client:
            return await client.call_tool("refund_order", {"order_id": "A-2026-1", "amount_cents": 12340})

    result = run(body)
    assert len(asked) == 1
    assert result.is_error is False, result.content[0].text
    assert result.meta["toolgate/approval_id"] == asked[0]
    events = door.wait_for_audit_events(
        lambda evs: any(e.get("approval_id") == asked[0] and e.get("status") == "OK" for e in evs)
    )
    redeemed = [e for e in events if e.get("approval_id") == asked[0] and e.get("kind") == "tool_call"]
    assert [e["status"] for e in redeemed] == ["APPROVAL_REQUIRED", "OK"]
    assert all(e["door"] == "mcp" for e in redeemed)


def test_a_sealed_approval_state_is_redeemed_once_and_only_for_its_caller(door, grpc_api):
    async def never_called(context, params):
        raise AssertionError("this test drives the rounds itself")

    async def body():
        async with host(door, "auto", elicitation_callback=never_called) as client:
            first = await client.session.call_tool(
                "refund_order", {"order_id": "A-2026-2", "amount_cents": 1999}, allow_input_required=True
            )
            assert isinstance(first, mcp_types.InputRequiredResult), first
            state = first.request_state
            approval_id = first.meta["toolgate/approval_id"]
            # Not approved yet: asked again, with the same approval.
            pending = await client.session.call_tool(
                "refund_order",
                {"order_id": "A-2026-2", "amount_cents": 1999},
                request_state=state,
                allow_input_required=True,
            )
            assert isinstance(pending, mcp_types.InputRequiredResult)
            assert pending.meta["toolgate/approval_id"] == approval_id
            await anyio.to_thread.run_sync(decide, grpc_api, approval_id)
            redeemed = await client.session.call_tool(
                "refund_order",
                {"order_id": "A-2026-2", "amount_cents": 1999},
                request_state=state,
                allow_input_required=True,
            )
            replayed = await client.session.call_tool(
                "refund_order",
                {"order_id": "A-2026-2", "amount_cents": 1999},
                request_state=state,
                allow_input_required=True,
            )
            # The same state, echoed with other arguments, redeems nothing.
            other_arguments = await client.session.call_tool(
                "refund_order",
                {"order_id": "A-2026-2", "amount_cents": 100000},
                request_state=state,
                allow_input_required=True,
            )
        async with host(door, "auto", dev_headers(subject="mallory"), elicitation_callback=never_called) as other:
            try:
                await other.session.call_tool(
                    "refund_order",
                    {"order_id": "A-2026-2", "amount_cents": 1999},
                    request_state=state,
                    allow_input_required=True,
                )
                stolen = None
            except Exception as err:  # the SDK raises the JSON-RPC error
                stolen = err
        return redeemed, replayed, other_arguments, stolen

    redeemed, replayed, other_arguments, stolen = run(body)
    assert redeemed.is_error is False, redeemed.content[0].text
    assert replayed.is_error is True and tool_error(replayed)["errorType"] == "approval_already_used"
    assert other_arguments.is_error is True
    assert tool_error(other_arguments)["errorType"] == "approval_arguments_changed"
    assert stolen is not None and "requestState" in str(stolen)


def test_approval_round_trip_2025_11_25_through_meta(door, grpc_api):
    arguments = {"order_id": "A-2025-1", "amount_cents": 5000}

    async def call(meta=None):
        async with host(door, "legacy") as client:
            return await client.call_tool("refund_order", arguments, meta=meta)

    first = run(call)
    assert first.is_error is True
    assert tool_error(first)["errorType"] == "approval_required"
    approval_id = first.meta["toolgate/approval_id"]
    # Nothing the host sends approves: repeating before the decision changes nothing.
    early = run(lambda: call({"toolgate/approval_id": approval_id}))
    assert early.is_error is True and tool_error(early)["errorType"] == "approval_pending"
    decide(grpc_api, approval_id)
    redeemed = run(lambda: call({"toolgate/approval_id": approval_id}))
    assert redeemed.is_error is False, redeemed.content[0].text
    again = run(lambda: call({"toolgate/approval_id": approval_id}))
    assert again.is_error is True and tool_error(again)["errorType"] == "approval_already_used"


# --- cancellation ---------------------------------------------------------------------------------


def _in_flight(server) -> float:
    metrics = httpx2.get(f"http://{server.admin_address}/metrics", timeout=5).text
    for line in metrics.splitlines():
        if line.startswith("toolgate_calls_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no toolgate_calls_in_flight in /metrics")


def _until(predicate, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_host_that_gives_up_cancels_the_call_and_its_backend(door):
    """The host cancels the request (the SDK closes its HTTP request): the call ends CANCELLED in
    the audit, long before the backend would have finished."""

    async def body():
        async with host(door, "auto") as client:
            async with anyio.create_task_group() as group:

                async def slow():
                    await client.call_tool("slow_task", {"ms": 20000}, meta={"toolgate/run_id": "run-cancel"})

                group.start_soon(slow)
                await anyio.to_thread.run_sync(_until, lambda: _in_flight(door) >= 1, "the call to start")
                group.cancel_scope.cancel()

    run(body)
    events = door.wait_for_audit_events(lambda evs: any(e.get("run_id") == "run-cancel" for e in evs))
    event = next(e for e in events if e.get("run_id") == "run-cancel")
    assert event["status"] == "CANCELLED" and event["door"] == "mcp"
    assert event["duration_ms"] < 20000
    _until(lambda: _in_flight(door) == 0, "the call to leave the sidecar")


def test_a_cancellation_notice_cancels_the_senders_call_it_names(door):
    """A 2025-11-25 host's notifications/cancelled comes as a POST of its own (no session ties it
    to the call): it cancels the call with that id of the caller who sent it, and its backend
    stops; the same notice from another caller is answered 202 and cancels nothing of theirs."""
    legacy = {"mcp-protocol-version": "2025-11-25"}
    request_id = "cancel-by-notice-1"
    call = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "slow_task", "arguments": {"ms": 20000}, "_meta": {"toolgate/run_id": "run-notice"}},
    }
    notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
    answers: list[httpx2.Response] = []

    async def body():
        async with anyio.create_task_group() as group:

            async def slow():
                answers.append(await anyio.to_thread.run_sync(lambda: raw_post(door, call, {**legacy})))

            group.start_soon(slow)
            await anyio.to_thread.run_sync(_until, lambda: _in_flight(door) >= 1, "the call to start")
            others = dev_headers(subject="mallory")
            stranger = await anyio.to_thread.run_sync(lambda: raw_post(door, notice, {**legacy, **others}))
            assert stranger.status_code == 202
            own = await anyio.to_thread.run_sync(lambda: raw_post(door, notice, legacy))
            assert own.status_code == 202

    run(body)
    (answer,) = answers
    assert answer.status_code == 200 and "error" in answer.json(), answer.text
    events = door.wait_for_audit_events(lambda evs: any(e.get("run_id") == "run-notice" for e in evs))
    event = next(e for e in events if e.get("run_id") == "run-notice")
    assert event["status"] == "CANCELLED" and event["door"] == "mcp"
    assert event["duration_ms"] < 20000
    _until(lambda: _in_flight(door) == 0, "the call to leave the sidecar")


def test_a_cancellation_notice_failing_the_transport_checks_cancels_nothing(door):
    """A notifications/cancelled with an Origin not allowed, or a Host naming another site (DNS
    rebinding: a page in the user's browser), is refused 403 before anything acts on it: the call
    it names runs to its end (issue 52, item 7: it was cancelled, then the notice refused)."""
    legacy = {"mcp-protocol-version": "2025-11-25"}
    request_id = "cancel-by-a-foreign-page"
    call = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "slow_task", "arguments": {"ms": 3000}, "_meta": {"toolgate/run_id": "run-foreign"}},
    }
    notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
    answers: list[httpx2.Response] = []
    refused: list[int] = []

    async def body():
        async with anyio.create_task_group() as group:

            async def slow():
                answers.append(await anyio.to_thread.run_sync(lambda: raw_post(door, call, {**legacy})))

            group.start_soon(slow)
            await anyio.to_thread.run_sync(_until, lambda: _in_flight(door) >= 1, "the call to start")
            for foreign in ({"origin": "http://evil.example"}, {"host": "rebound.example"}):
                answer = await anyio.to_thread.run_sync(lambda: raw_post(door, notice, {**legacy, **foreign}))
                refused.append(answer.status_code)

    run(body)
    assert refused == [403, 403]
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["_meta"]["toolgate/status"] == "OK", answer.text
    events = door.wait_for_audit_events(lambda evs: any(e.get("run_id") == "run-foreign" for e in evs))
    event = next(e for e in events if e.get("run_id") == "run-foreign")
    assert event["status"] == "OK", event


# --- the transport's rules ------------------------------------------------------------------------


def raw_post(server, body: dict | str, headers: dict | None = None) -> httpx2.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx2.post(
        url(server),
        content=content,
        headers={"content-type": "application/json", "accept": ACCEPT, **dev_headers(), **(headers or {})},
        timeout=10,
    )


def modern_meta() -> dict:
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "1"},
    }


def test_an_origin_not_configured_is_refused(door):
    response = raw_post(door, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"origin": "http://evil.example"})
    assert response.status_code == 403


def test_a_host_header_not_allowed_is_refused(door):
    response = raw_post(door, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"host": "rebound.example"})
    assert response.status_code == 403


def test_headers_that_disagree_with_the_body_are_refused(door):
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "x"}, "_meta": modern_meta()},
    }
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call"}
    agreeing = raw_post(door, body, {**headers, "mcp-name": "echo"})
    assert agreeing.status_code == 200 and agreeing.json()["result"]["content"][0]["text"] == "x"
    for wrong in ({**headers, "mcp-name": "delete_ticket"}, {**headers, "mcp-method": "tools/list", "mcp-name": "echo"}):
        response = raw_post(door, body, wrong)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == -32020


def test_notifications_are_accepted_and_discover_names_both_revisions(door):
    note = raw_post(
        door, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {"mcp-protocol-version": "2025-11-25"}
    )
    assert note.status_code == 202
    discovered = raw_post(
        door,
        {"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {"_meta": modern_meta()}},
        {"mcp-protocol-version": "2026-07-28", "mcp-method": "server/discover"},
    )
    assert discovered.status_code == 200, discovered.text
    result = discovered.json()["result"]
    assert set(result["supportedVersions"]) == {"2026-07-28", "2025-11-25"}
    assert result["capabilities"]["tools"] is not None


def test_a_body_over_the_message_limit_is_refused(door):
    text = "a" * (5 * 1024 * 1024)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": text}}}
    response = raw_post(door, body, {"mcp-protocol-version": "2025-11-25"})
    assert response.status_code == 413


# --- identity: an OAuth 2.1 resource server ---------------------------------------------------------

RESOURCE = "https://toolgate.test/mcp"
SECRET = "mcp-door-test-secret-of-at-least-32-bytes"


@pytest.fixture(scope="module")
def jwt_door(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mcp-jwt")
    (tmp / "secret").write_text(SECRET)
    config = tmp / "catalog.yaml"
    config.write_text(
        f"""version: 1
server:
  mcp:
    listen: "127.0.0.1:0"
    resource: "{RESOURCE}"
    authorization_servers: ["https://issuer.test"]
    required_scopes: ["mcp:tools"]
    allowed_hosts: ["127.0.0.1"]
identity:
  jwt:
    hs256_secret_file: secret
    issuer: ["https://issuer.test"]
    audience: ["toolgate-grpc"]
audit:
  sink: stdout
tenants:
  initech: {{}}
tools:
  - name: echo
    description: Returns the text.
    risk_level: read_only
    executor: {{ builtin: echo }}
    input_schema:
      type: object
      properties: {{ text: {{ type: string }} }}
      required: [text]
"""
    )
    server = toolgate_process.start(args=("--config", str(config)))
    yield server
    assert toolgate_process.stop(server) == 0, server.stderr_text()


def token(audience=RESOURCE, scope="mcp:tools", tenant="acme", **claims) -> str:
    now = int(time.time())
    body = {"iss": "https://issuer.test", "aud": audience, "sub": "alice", "tenant": tenant, "scope": scope}
    return jwt.encode({**body, "iat": now, "exp": now + 300, **claims}, SECRET, algorithm="HS256")


def test_no_token_gets_401_naming_the_resource_metadata(jwt_door):
    response = httpx2.post(
        url(jwt_door),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"accept": ACCEPT},
        timeout=10,
    )
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    metadata_url = f"https://toolgate.test/.well-known/oauth-protected-resource/mcp"
    assert challenge.startswith("Bearer ") and f'resource_metadata="{metadata_url}"' in challenge
    # The document is served by the door itself, at the path the URL names.
    metadata = httpx2.get(f"http://{jwt_door.mcp_address}/.well-known/oauth-protected-resource/mcp", timeout=10)
    assert metadata.status_code == 200
    assert metadata.json()["resource"] == RESOURCE
    assert metadata.json()["authorization_servers"] == ["https://issuer.test"]
    assert metadata.json()["scopes_supported"] == ["mcp:tools"]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: token(audience="toolgate-grpc"), id="the gRPC door's audience"),
        pytest.param(lambda: token(audience="https://other.test/mcp"), id="another resource"),
        pytest.param(lambda: token(exp=int(time.time()) - 600), id="expired"),
        pytest.param(lambda: token()[:-4] + "AAAA", id="bad signature"),
    ],
)
def test_a_token_not_for_this_resource_gets_401_invalid_token(jwt_door, bad):
    response = httpx2.post(
        url(jwt_door),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"accept": ACCEPT, "authorization": f"Bearer {bad()}"},
        timeout=10,
    )
    assert response.status_code == 401, response.text
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


def test_a_token_without_the_door_scope_gets_403_insufficient_scope(jwt_door):
    response = httpx2.post(
        url(jwt_door),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"accept": ACCEPT, "authorization": f"Bearer {token(scope='other')}"},
        timeout=10,
    )
    assert response.status_code == 403
    challenge = response.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="mcp:tools"' in challenge


@BOTH_REVISIONS
def test_a_token_for_this_resource_is_served_and_names_the_caller(jwt_door, mode, revision):
    async def body():
        async with host(jwt_door, mode, {"authorization": f"Bearer {token(tenant='initech')}"}) as client:
            assert client.protocol_version == revision
            names = [t.name for t in (await client.list_tools()).tools]
            # Nothing the host sends names the caller but the token: _meta and clientInfo are
            # not identity.
            result = await client.call_tool(
                "echo", {"text": "via jwt"}, meta={"toolgate/run_id": f"jwt-{revision}", "tenant": "acme"}
            )
        return names, result

    names, result = run(body)
    assert names == ["echo"] and result.content[0].text == "via jwt"
    events = jwt_door.wait_for_audit_events(lambda evs: any(e.get("run_id") == f"jwt-{revision}" for e in evs))
    event = next(e for e in events if e.get("run_id") == f"jwt-{revision}")
    assert event["tenant"] == "initech" and event["subject"] == "alice" and event["door"] == "mcp"


# --- announcing changes ---------------------------------------------------------------------------


def test_a_reload_that_changes_what_a_caller_sees_is_announced(tmp_path):
    """2026-07-28: a host listening for tools/list_changed hears of a reload that changes its
    list, and lists again."""
    import signal

    config = _demo_with_approvals_url(tmp_path)
    server = toolgate_process.start(args=("--config", str(config)))
    try:

        async def body():
            async with host(server, "auto", dev_headers(tenant="globex")) as client:
                before = sorted(t.name for t in (await client.list_tools()).tools)
                async with client.listen(tools_list_changed=True) as subscription:
                    text = config.read_text()
                    denied = "    deny:\n      - delete_ticket\n"
                    assert denied in text
                    config.write_text(text.replace(denied, denied + "      - echo\n", 1))
                    server.process.send_signal(signal.SIGHUP)
                    event = await subscription.__anext__()
                after = sorted(t.name for t in (await client.list_tools()).tools)
            return before, event, after

        before, event, after = run(body)
        assert "echo" in before and "echo" not in after
        assert "tools" in type(event).__name__.lower() or "tools" in str(event).lower(), event
    finally:
        assert toolgate_process.stop(server) == 0, server.stderr_text()


def test_requests_to_the_door_write_no_log_lines_of_their_own():
    """Logs are for what an operator acts on: a busy door must not write lines per request (rmcp
    logs each stateless request's service at info, three lines per call, left to itself)."""
    server = toolgate_process.start()
    calls = 30

    async def body():
        async with host(server, "legacy") as client:
            for i in range(calls):
                result = await client.call_tool("echo", {"text": f"quiet {i}"})
                assert result.is_error is False

    try:
        run(body)
    finally:
        assert toolgate_process.stop(server) == 0, server.stderr_text()
    # Stopped, so every line it wrote has been read.
    lines = server.stderr_lines
    assert len(lines) < calls, "".join(lines[-10:])
    assert not [line for line in lines if '"rmcp' in line], "".join(lines[-10:])
