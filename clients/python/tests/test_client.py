"""The sync Client against the real binary: tools, calls, refusals, batches, deadlines, approvals,
paging, retries, and transport failures as typed exceptions."""

from __future__ import annotations

import grpc
import pytest
from conftest import approver_identity, demo_identity, events_of, interval_ms

import toolgate
from toolgate import (
    ApprovalState,
    Client,
    DeadlineExceededError,
    DevIdentity,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PageLimitError,
    PermissionDeniedError,
    RetryPolicy,
    RiskLevel,
    ToolCall,
    ToolCallError,
    ToolStatus,
    UnauthenticatedError,
    UnavailableError,
)
from toolgate.models import PROTO_ENUMS


def test_the_typed_enums_match_the_generated_stubs():
    # A proto change that adds, renames or renumbers a value fails here until models.py follows.
    for ours, (proto_enum, prefix) in PROTO_ENUMS.items():
        theirs = {name.removeprefix(prefix): number for name, number in proto_enum.items()}
        if ours is toolgate.ApprovalDecision:
            theirs.pop("UNSPECIFIED")  # refused by the server; not offered
        assert {m.name: m.value for m in ours} == theirs, ours


def test_list_tools_returns_typed_definitions_without_bound_arguments(client):
    tools = client.list_tools()
    assert [t.name for t in tools] == sorted(
        ["create_ticket", "delete_ticket", "echo", "query_ticket", "rag_search", "refund_order", "slow_task"]
    )
    assert len(tools.catalog_revision) == 32
    rag = tools.get("rag_search")
    assert rag.risk_level is RiskLevel.READ_ONLY
    assert set(rag.input_schema["properties"]) == {"query", "top_k"}, "filter is bound by the server"
    refund = tools.get("refund_order")
    assert refund.requires_approval and refund.risk_level is RiskLevel.WRITE_CONFIRMED
    assert tools.get("create_ticket").required_scopes == ("tickets:write",)
    assert tools.get("slow_task").timeout_ms == 1000


def test_the_agent_in_the_identity_narrows_the_tools(make_client):
    tools = make_client(agent="support-bot").list_tools()
    assert {t.name for t in tools} == {"echo", "rag_search", "query_ticket", "create_ticket"}


def test_an_ok_call_returns_the_tools_output_as_model_text(client, run_id):
    result = client.execute("echo", {"text": "héllo"}, run_id=run_id, step=1)
    assert result.status is ToolStatus.OK and result.ok
    assert result.model_text == "héllo"
    assert result.call_id == "tool_step_1_0"
    assert result.raise_for_status() is result


def test_raw_model_json_is_passed_on_unchanged(client):
    result = client.execute(ToolCall(name="echo", arguments='{"text": "raw"}', call_id="c1"))
    assert (result.status, result.model_text, result.call_id) == (ToolStatus.OK, "raw", "c1")

    broken = client.execute(ToolCall(name="echo", arguments='{"text": '))
    assert broken.status is ToolStatus.INVALID_ARGUMENTS
    assert broken.error_type == "arguments_not_json"


def test_a_refused_call_is_a_result_unless_the_caller_asks_for_an_exception(client):
    attack = {"query": "refund", "filter": {"tenant": "globex"}}
    result = client.execute("rag_search", attack)
    assert result.status is ToolStatus.DENIED
    assert (result.error_type, result.refused_by) == ("bound_argument_override", "bind")
    assert result.model_text.startswith('TOOL_ERROR: {"errorType":"bound_argument_override"')
    assert not result.retryable

    with pytest.raises(ToolCallError) as raised:
        client.execute("rag_search", attack, check=True)
    assert raised.value.result.error_type == "bound_argument_override"


def test_rag_search_is_bound_to_the_callers_tenant(make_client):
    for tenant in ("acme", "globex"):
        result = make_client(tenant=tenant).execute("rag_search", {"query": "refund policy"})
        hits = result.json()["results"]
        assert hits and all(hit["id"].startswith(f"{tenant}-") for hit in hits), (tenant, hits)


def test_execute_many_returns_results_in_call_order(client, run_id):
    calls = [
        ToolCall("echo", {"text": "first"}, call_id="a"),
        ToolCall("nope", {}, call_id="b"),
        ToolCall("echo", {"text": "third"}, call_id="c"),
    ]
    results = client.execute_many(calls, parallel=True, run_id=run_id, step=2)
    assert [(r.call_id, r.status) for r in results] == [
        ("a", ToolStatus.OK),
        ("b", ToolStatus.NOT_FOUND),
        ("c", ToolStatus.OK),
    ]
    assert results[2].model_text == "third"
    with pytest.raises(ToolCallError):
        client.execute_many(calls, check=True)


@pytest.mark.parametrize("parallel", [True, False])
def test_execute_many_runs_the_turn_in_parallel_only_when_asked(client, toolgate, run_id, parallel):
    calls = [ToolCall("slow_task", {"ms": 300}, call_id=f"slow{i}") for i in range(3)]
    results = client.execute_many(calls, parallel=parallel, run_id=run_id)
    assert all(r.ok for r in results)

    events = events_of(toolgate, lambda e: e.get("run_id") == run_id and e["kind"] == "tool_call", 3)
    spans = sorted(interval_ms(e) for e in events)
    if parallel:
        # Every call started before any of them ended.
        assert max(start for start, _ in spans) < min(end for _, end in spans), spans
    else:
        # Each started once the previous one had ended (1 ms for rounding).
        for (_, end), (next_start, _) in zip(spans, spans[1:]):
            assert next_start >= end - 1, spans


def test_a_tool_past_its_timeout_is_a_timeout_result(client):
    result = client.execute("slow_task", {"ms": 5000}, timeout=5.0)
    assert result.status is ToolStatus.TIMEOUT
    assert result.retryable, "slow_task is read-only, so a repeat is safe"


def test_a_call_its_own_deadline_ends_is_a_timeout_result_not_deadline_exceeded(client):
    # slow_task's own timeout is 1 s: the client's 0.9 s deadline comes first. The sidecar stops the
    # tool a tenth of the deadline early (90 ms) so that its answer arrives in time; a sidecar that
    # answered at the deadline itself would lose the race and the client would raise.
    result = client.execute("slow_task", {"ms": 5000}, timeout=0.9)
    assert (result.status, result.error_type) == (ToolStatus.TIMEOUT, "timeout"), result
    assert "the client's deadline" in result.model_text


@pytest.mark.parametrize("form", ["unix://{}", "unix:{}"])
def test_the_client_talks_to_the_sidecar_over_its_unix_socket(unix_toolgate, run_id, form):
    server, socket_path = unix_toolgate
    with Client(form.format(socket_path), identity=demo_identity()) as over_socket:
        assert "echo" in {t.name for t in over_socket.list_tools()}
        result = over_socket.execute("echo", {"text": "over the socket"}, run_id=run_id)
    assert (result.status, result.model_text) == (ToolStatus.OK, "over the socket"), result
    assert events_of(server, lambda e: e.get("run_id") == run_id, 1)[0]["status"] == "OK"


def test_a_sidecar_that_never_answers_raises_deadline_exceeded(silent_listener):
    with Client(silent_listener, identity=demo_identity(), timeout=0.5) as hung:
        with pytest.raises(DeadlineExceededError) as raised:
            hung.execute("echo", {"text": "hi"})
    assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert raised.value.method == "ExecuteTool"


def test_a_sidecar_that_is_down_raises_unavailable(closed_port):
    with Client(f"127.0.0.1:{closed_port}", identity=demo_identity()) as down:
        with pytest.raises(UnavailableError) as raised:
            down.list_tools()
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE


def test_request_level_errors_are_typed(make_client):
    with pytest.raises(UnauthenticatedError):
        make_client(identity=DevIdentity(tenant="")).list_tools()
    with pytest.raises(InvalidArgumentError):
        make_client().execute_many([ToolCall("echo", {"text": "x"})] * 129)  # limits.max_batch_calls is 128
    with pytest.raises(ValueError):
        make_client().execute("echo", {"text": "x"}, timeout=0)


def test_an_approval_round_trip(client, approver, make_client, toolgate, run_id):
    arguments = {"order_id": "A-1001", "amount_cents": 2500}
    first = client.execute("refund_order", arguments, run_id=run_id)
    assert first.status is ToolStatus.APPROVAL_REQUIRED
    assert first.approval_id.startswith("apr_") and first.approval_id in first.model_text

    pending = {a.approval_id: a for a in approver.iter_approvals()}
    listed = pending[first.approval_id]
    assert (listed.tool, listed.subject, listed.run_id, listed.state) == (
        "refund_order",
        "alice",
        run_id,
        ApprovalState.PENDING,
    )
    assert listed.arguments_json == "" and '"order_id":"A-1001"' in listed.arguments_preview
    full = approver.get_approval(first.approval_id)
    assert full.arguments_json == '{"amount_cents":2500,"order_id":"A-1001"}'

    with pytest.raises(PermissionDeniedError):
        client.approve(first.approval_id)  # alice lacks toolgate:approve, and asked for it herself
    decided = approver.approve(first.approval_id, reason="customer called")
    assert (decided.state, decided.decided_by, decided.reason) == (ApprovalState.APPROVED, "bob", "customer called")
    with pytest.raises(FailedPreconditionError):
        approver.reject(first.approval_id, reason="too late")

    again = client.execute(
        ToolCall("refund_order", {"amount_cents": 2500, "order_id": "A-1001"}, approval_id=first.approval_id),
        run_id=run_id,
    )
    assert again.status is ToolStatus.OK, again
    assert again.json() == {"refunded": "A-1001", "amount_cents": 2500, "status": "refunded"}
    assert approver.get_approval(first.approval_id).state is ApprovalState.USED

    with pytest.raises(NotFoundError):
        approver.get_approval("apr_00000000000000000000000000000000")
    assert make_client(identity=approver_identity("globex")).list_approvals().approvals == (), "tenants are apart"


def test_approvals_page_through_every_pending_one(fresh_toolgate, make_client, run_id):
    client = make_client(server=fresh_toolgate)
    approver = make_client(server=fresh_toolgate, identity=approver_identity())
    ids = []
    for n in range(5):
        result = client.execute("delete_ticket", {"ticket_id": f"T-{n}"}, run_id=run_id)
        assert result.status is ToolStatus.APPROVAL_REQUIRED
        ids.append(result.approval_id)

    # Oldest first: by creation time in milliseconds, then by id. Calls made within one
    # millisecond are listed by id, not in the order they were made.
    listed = list(approver.iter_approvals(page_size=2))
    order = [a.approval_id for a in sorted(listed, key=lambda a: (a.created_at_unix_ms, a.approval_id))]
    assert [a.approval_id for a in listed] == order and sorted(order) == sorted(ids)
    created = {a.approval_id: a.created_at_unix_ms for a in listed}
    assert [created[i] for i in ids] == sorted(created[i] for i in ids), "made in this order"

    first = approver.list_approvals(page_size=2)
    assert [a.approval_id for a in first] == order[:2] and first.next_page_token
    second = approver.list_approvals(page_size=2, page_token=first.next_page_token)
    assert [a.approval_id for a in second] == order[2:4]
    with pytest.raises(PageLimitError):
        list(approver.iter_approvals(page_size=2, max_pages=2))
    assert list(approver.iter_approvals(state=ApprovalState.APPROVED)) == []


class RecordedSleeps(list):
    """A RetryPolicy sleep that records each wait instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def test_retries_respect_retry_after_and_stop_at_max_attempts(fresh_toolgate, make_client, run_id):
    client = make_client(server=fresh_toolgate)
    for n in range(5):  # refund_order allows 5 calls a minute per tenant
        assert client.execute("refund_order", {"order_id": f"A-{n}", "amount_cents": 2500}).status is (
            ToolStatus.APPROVAL_REQUIRED
        )

    limited = client.execute("refund_order", {"order_id": "A-9", "amount_cents": 2500}, run_id="plain")
    assert limited.status is ToolStatus.RATE_LIMITED and limited.retryable and limited.retry_after_ms > 0

    sleeps = RecordedSleeps()
    policy = RetryPolicy(max_attempts=3, max_retry_after=120, sleep=sleeps)
    retried = client.execute("refund_order", {"order_id": "A-9", "amount_cents": 2500}, run_id=run_id, retry=policy)
    assert retried.status is ToolStatus.RATE_LIMITED
    assert len(sleeps) == 2
    # Each wait is at least what the sidecar asked for (it only shrinks as the window passes).
    assert all(wait >= retried.retry_after_ms / 1000 for wait in sleeps), (sleeps, retried.retry_after_ms)
    attempts = events_of(fresh_toolgate, lambda e: e.get("run_id") == run_id, 3)
    assert [e["status"] for e in attempts] == ["RATE_LIMITED"] * 3

    impatient = RetryPolicy(max_attempts=3, max_retry_after=0.001, sleep=RecordedSleeps())
    client.execute("refund_order", {"order_id": "A-9", "amount_cents": 2500}, retry=impatient)
    assert impatient.sleep == [], "a longer wait than max_retry_after is not waited for"


def test_results_that_are_not_retryable_are_not_retried(client, toolgate, run_id):
    sleeps = RecordedSleeps()
    result = client.execute(
        "rag_search",
        {"query": "x", "filter": {"tenant": "globex"}},
        run_id=run_id,
        retry=RetryPolicy(max_attempts=5, sleep=sleeps),
    )
    assert result.status is ToolStatus.DENIED and sleeps == []
    assert len(events_of(toolgate, lambda e: e.get("run_id") == run_id, 1)) == 1


def test_transport_retries_only_where_a_repeat_cannot_run_a_tool_twice(closed_port):
    sleeps = RecordedSleeps()
    policy = RetryPolicy(max_attempts=4, sleep=sleeps)
    with Client(f"127.0.0.1:{closed_port}", identity=demo_identity(), retry=policy) as down:
        with pytest.raises(UnavailableError):
            down.list_tools()
        assert len(sleeps) == 3

        sleeps.clear()
        with pytest.raises(UnavailableError):
            down.execute("create_ticket", {"title": "t"})
        assert sleeps == [], "without an idempotency key a lost answer may hide a call that ran"

        with pytest.raises(UnavailableError):
            down.execute(ToolCall("create_ticket", {"title": "t"}, idempotency_key="k1"))
        assert len(sleeps) == 3

        # The approval reads change nothing, so they are retried; a decision is not.
        for read in (down.list_approvals, lambda: list(down.iter_approvals()), lambda: down.get_approval("apr_x")):
            sleeps.clear()
            with pytest.raises(UnavailableError):
                read()
            assert len(sleeps) == 3, read
        sleeps.clear()
        with pytest.raises(UnavailableError):
            down.approve("apr_x")
        assert sleeps == [], "a decision whose answer was lost must not be sent again"
