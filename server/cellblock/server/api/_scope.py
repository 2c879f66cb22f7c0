"""Scope checks shared by every RPC (SPEC §3.1 item 2-3)."""

from __future__ import annotations

from functools import cache

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

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


def is_id_field(field: FieldDescriptor) -> bool:
    """Tells whether a request field is an id (``id`` or ``*_id``, a string): capped by [A03]."""
    return field.type == FieldDescriptor.TYPE_STRING and (field.name == "id" or field.name.endswith("_id"))


@cache
def _holds_ids(descriptor: Descriptor) -> bool:
    """Tells whether a message type has id fields, itself or in the messages it holds."""
    return any(is_id_field(f) or (f.message_type is not None and f.message_type is not descriptor and _holds_ids(f.message_type)) for f in descriptor.fields)


def long_id(message: Message, prefix: str = "") -> str | None:
    """Finds an id field longer than :data:`MAX_SCOPE_ID_CHARS` anywhere in a request (SPEC §3.1 item 5).

    Args:
        message: A decoded request message.
        prefix: The path of ``message`` in the request, for the reply.

    Returns:
        The dotted path of the first such field (``scope.session_id``), or ``None``.
    """
    for field, value in message.ListFields():
        if is_id_field(field):
            values = value if field.is_repeated else [value]
            if any(len(v) > MAX_SCOPE_ID_CHARS for v in values):
                return prefix + field.name
        elif field.message_type is not None and _holds_ids(field.message_type) and not field.message_type.GetOptions().map_entry:
            items = value if field.is_repeated else [value]
            for item in items:
                found = long_id(item, f"{prefix}{field.name}.")
                if found is not None:
                    return found
    return None


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
