"""Scope checks shared by every RPC (SPEC §3.1 item 2-3)."""

from __future__ import annotations

import grpc

from cellblock.server import messages as msg
from cellblock.server.limits import MAX_SCOPE_ID_CHARS
from cellblock.v1 import common_pb2


async def require_scope(scope: common_pb2.Scope, context: grpc.aio.ServicerContext) -> tuple[str, str]:
    """Returns ``(session_id, agent_run_id)`` or aborts with INVALID_ARGUMENT."""
    for field in ("session_id", "agent_run_id"):
        value = getattr(scope, field)
        if not value.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"scope.{field} must be a non-empty string")
        if len(value) > MAX_SCOPE_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.a03(f"scope.{field}", MAX_SCOPE_ID_CHARS))
    return (scope.session_id, scope.agent_run_id)


async def require_short_ids(context: grpc.aio.ServicerContext, **ids: str) -> None:
    """Aborts with INVALID_ARGUMENT [A03] when an id is longer than :data:`MAX_SCOPE_ID_CHARS`."""
    for field, value in ids.items():
        if len(value) > MAX_SCOPE_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.a03(field, MAX_SCOPE_ID_CHARS))


async def page_start(page_token: str, context: grpc.aio.ServicerContext) -> int:
    """Returns the offset a page token encodes, or aborts with INVALID_ARGUMENT.

    Tokens are the decimal offsets this service hands out as ``next_page_token``;
    an empty token is the first page.
    """
    if not page_token:
        return 0
    if not page_token.isdigit() or len(page_token) > 9:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_token is not a token this service returned; pass next_page_token unchanged or leave it empty")
    return int(page_token)
