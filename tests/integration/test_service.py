"""The control service's standard gRPC services: health and reflection."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cellblock.server.app import Service

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_health_reports_serving_for_each_service(service: Service) -> None:
    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "cellblock.v1.CodeModeService", "cellblock.v1.CatalogService", "cellblock.v1.RunService"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Check(health_pb2.HealthCheckRequest(service="cellblock.v1.Nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_the_public_services(service: Service) -> None:
    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def requests():  # type: ignore[no-untyped-def]
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = set()
        async for reply in stub.ServerReflectionInfo(requests()):
            names.update(s.name for s in reply.list_services_response.service)
    assert {"cellblock.v1.CatalogService", "cellblock.v1.CodeModeService", "cellblock.v1.RunService", "grpc.health.v1.Health"} <= names
    assert "cellblock.bridge.v1.BridgeService" not in names, "the bridge is internal and served only on cell sockets"
