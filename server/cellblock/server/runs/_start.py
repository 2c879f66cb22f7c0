"""A leg's ``Start`` message on the wire, its catalog serialized once per catalog version (SPEC §2.3).

``Start.catalog_json`` carries the run's guest catalog: megabytes for a scope with large
``mcp`` schemas (their declarations and the schemas themselves). Building and serializing
that message on the event loop for every leg held the loop for 60-80 ms at a time. The
catalog part is therefore serialized once per catalog version, in a worker process
(:func:`start_catalog_part`), and every leg appends only its own fields
(:func:`start_message`): protobuf parsers merge two occurrences of the same embedded
message field, so ``part + AttachResponse(start=<leg fields>)`` parses as one
``AttachResponse`` whose ``Start`` has both the catalog and the leg's fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cellblock.bridge.v1 import bridge_service_pb2 as bpb

__all__ = ["join_bytes", "start_catalog_part", "start_message", "start_message_off_loop"]

#: Bytes above which :func:`join_bytes` copies in a thread (below, a join takes microseconds).
THREAD_JOIN_BYTES = 1 << 20


async def join_bytes(parts: Sequence[bytes | memoryview]) -> bytes:
    """``b"".join(parts)``, in a thread when over 1 MB: ``bytes.join`` copies large inputs without the GIL.

    A join of tens of MB held the event loop 20-40 ms (mostly page faults of the new buffer);
    in a thread the loop runs meanwhile (SPEC §2.3 "loop hold").
    """
    if sum(len(p) for p in parts) > THREAD_JOIN_BYTES:
        return await asyncio.to_thread(b"".join, parts)
    return b"".join(parts)


def start_catalog_part(catalog_json: str) -> bytes:
    """The serialized ``AttachResponse`` whose ``Start`` carries only ``catalog_json``.

    Args:
        catalog_json: The compact JSON of the run's guest catalog (SPEC §8.1).
    """
    return bpb.AttachResponse(start=bpb.Start(catalog_json=catalog_json)).SerializeToString()


def start_message(catalog_part: bytes, start: bpb.Start) -> bytes:
    """One leg's ``AttachResponse(start=...)`` as bytes: the catalog part, then the leg's fields.

    Args:
        catalog_part: :func:`start_catalog_part` of the run's catalog.
        start: The leg's ``Start`` without ``catalog_json`` (a set one would be overridden
            by the catalog part's only if it came later; it must be empty).
    """
    return b"".join(_start_parts(catalog_part, start))


async def start_message_off_loop(catalog_part: bytes, start: bpb.Start) -> bytes:
    """:func:`start_message`, a catalog part of megabytes copied in a thread (:func:`join_bytes`)."""
    return await join_bytes(_start_parts(catalog_part, start))


def _start_parts(catalog_part: bytes, start: bpb.Start) -> list[bytes | memoryview]:
    if start.catalog_json:
        raise ValueError("the leg's Start must not carry catalog_json: the catalog part does")
    return [catalog_part, bpb.AttachResponse(start=start).SerializeToString()]
