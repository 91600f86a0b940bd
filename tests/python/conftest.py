"""Shared support for the black-box tests: start the real toolgate binary, talk to it over gRPC.

The `toolgate` fixture runs the binary on the embedded demo catalog (toolgate_process.py: it learns
the bound address from the JSON log), and on teardown stops it with SIGTERM and checks that it
exits 0. Every wait here is bounded; nothing sleeps to synchronize.

Message types come from the server itself (gRPC server reflection), never from generated stubs or
the .proto file: the tests check the contract a client without our sources would see.
"""

from __future__ import annotations

import collections

import grpc
import pytest
import toolgate_process
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from toolgate_process import REPO_ROOT, ToolgateServer, _toolgate_bin  # noqa: F401 (test_deploy imports these)

DEFAULT_RPC_DEADLINE_S = toolgate_process.DEFAULT_RPC_DEADLINE_S


@pytest.fixture(scope="session")
def toolgate() -> ToolgateServer:
    """The real binary serving the embedded demo catalog on an ephemeral loopback port."""
    server = toolgate_process.start()
    yield server
    code = toolgate_process.stop(server)
    assert code == 0, f"toolgate exited with {code} after SIGTERM; stderr:\n{server.stderr_text()}"


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _DefaultDeadline(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Gives every call without a deadline one, so no RPC (reflection's included) can hang a test."""

    def __init__(self, seconds: float):
        self._seconds = seconds

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        if details.timeout is not None:
            return details
        return _CallDetails(
            details.method,
            self._seconds,
            details.metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


@pytest.fixture(scope="session")
def channel(toolgate: ToolgateServer) -> grpc.Channel:
    """An insecure channel to the server; every call gets a default deadline."""
    raw = grpc.insecure_channel(toolgate.address)
    grpc.channel_ready_future(raw).result(timeout=DEFAULT_RPC_DEADLINE_S)
    with raw:
        yield grpc.intercept_channel(raw, _DefaultDeadline(DEFAULT_RPC_DEADLINE_S))


class ReflectedApi:
    """toolgate's services and message types as learned from the server's reflection service."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.database = ProtoReflectionDescriptorDatabase(channel)
        self.pool = descriptor_pool.DescriptorPool(self.database)

    def services(self) -> list[str]:
        return list(self.database.get_services())

    def enum_value(self, enum_full_name: str, value_name: str) -> int:
        return self.pool.FindEnumTypeByName(enum_full_name).values_by_name[value_name].number

    def unary(self, service: str, method: str):
        """Return (request class, callable) for `service.method`, typed from its descriptors."""
        method_desc = self.pool.FindServiceByName(service).FindMethodByName(method)
        request_cls = message_factory.GetMessageClass(method_desc.input_type)
        response_cls = message_factory.GetMessageClass(method_desc.output_type)
        call = self.channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        return request_cls, call


@pytest.fixture(scope="session")
def api(channel: grpc.Channel) -> ReflectedApi:
    return ReflectedApi(channel)


def _identity(
    tenant: str = "acme",
    subject: str = "pytest-user",
    agent: str = "pytest-agent",
    scopes: tuple[str, ...] = ("tickets:read", "tickets:write"),
) -> tuple[tuple[str, str], ...]:
    """Dev-identity metadata (the demo catalog trusts x-toolgate-* headers)."""
    return (
        ("x-toolgate-tenant", tenant),
        ("x-toolgate-subject", subject),
        ("x-toolgate-agent", agent),
        ("x-toolgate-scopes", ",".join(scopes)),
    )


@pytest.fixture
def identity():
    """Builds dev-identity metadata: `identity(tenant="globex", agent="support-bot")`."""
    return _identity
