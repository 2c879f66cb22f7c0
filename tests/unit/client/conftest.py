"""Fixtures of the client's unit tests: a FAKE service (tests/support/fake_cellblock.py) and a client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc.aio
import pytest_asyncio

from cellblock.client import CellblockClient
from cellblock.v1 import catalog_service_pb2_grpc, code_mode_service_pb2_grpc, run_service_pb2_grpc
from tests.support.fake_cellblock import FakeCatalogs, FakeCodeMode, FakeRuns, FakeState, serving


@pytest_asyncio.fixture(loop_scope="function")
async def fake() -> AsyncIterator[tuple[FakeState, str]]:
    state = FakeState()

    def register(server: grpc.aio.Server) -> None:
        code_mode_service_pb2_grpc.add_CodeModeServiceServicer_to_server(FakeCodeMode(state), server)
        catalog_service_pb2_grpc.add_CatalogServiceServicer_to_server(FakeCatalogs(), server)
        run_service_pb2_grpc.add_RunServiceServicer_to_server(FakeRuns(), server)

    async with serving(register) as address:
        yield state, address


@pytest_asyncio.fixture(loop_scope="function")
async def client(fake: tuple[FakeState, str]) -> AsyncIterator[CellblockClient]:
    async with await CellblockClient.connect(fake[1], timeout=5) as c:
        yield c
