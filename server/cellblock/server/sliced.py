"""A worker's large JSON-like result, pickled in pieces the loop unpickles between turns (SPEC §3.1 item 6).

A worker call's result is unpickled by the pool's thread in the service process, holding
Python's lock: the loop thread waits meanwhile. A registration's decoded tools (3,000 host
tools of 5 KB, or one 22 MB schema) are hundreds of thousands of small objects, and their
unpickling held the lock 60-126 ms at once. :func:`pack` (in the worker) turns such a value
into pickles of about :data:`PIECE_NODES` nodes each, which the pool's thread reads as
plain ``bytes`` (a copy); :func:`unpack` (on the loop) unpickles one piece per loop turn and
puts the value back together.

Only ``dict`` and ``list`` containers are split; any other value (and any container of at
most :data:`PIECE_NODES` nodes) travels whole. Sharing between parts of the value is not
kept (JSON values have none).
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any, NamedTuple

#: Nodes (containers and scalars) per piece: about 1 ms of unpickling on a loaded machine.
PIECE_NODES = 4000


class _Open(NamedTuple):
    """A split container: ``made`` is its number, ``kind`` 0 for a ``dict``, 1 for a ``list``."""

    made: int
    kind: int


#: One step of a packed value: ``(parent, key, value)``; ``parent`` -1 is the root; a list parent appends (``key`` ``None``).
_Op = tuple[int, Any, Any]


def _count(value: Any, counts: dict[int, int]) -> int:
    """Nodes in ``value`` (recorded per container in ``counts``, by ``id``). Depth is bounded by the registration checks."""
    if isinstance(value, dict):
        n = 1 + sum(_count(v, counts) for v in value.values())
    elif isinstance(value, list):
        n = 1 + sum(_count(v, counts) for v in value)
    else:
        return 1
    counts[id(value)] = n
    return n


def pack(value: Any, piece_nodes: int = PIECE_NODES) -> list[bytes]:
    """``value`` as pickles of about ``piece_nodes`` nodes each (run in the worker); :func:`unpack` reverses it."""
    counts: dict[int, int] = {}
    _count(value, counts)
    pieces: list[bytes] = []
    ops: list[_Op] = []
    nodes = 0
    made = 0
    stack: list[tuple[int, Any, Any]] = [(-1, None, value)]
    while stack:
        parent, key, item = stack.pop()
        size = counts.get(id(item), 1)
        if size <= piece_nodes or not isinstance(item, (dict, list)):
            ops.append((parent, key, item))
            nodes += size
        else:
            number, made = made, made + 1
            if isinstance(item, dict):
                ops.append((parent, key, _Open(number, 0)))
                stack.extend((number, k, v) for k, v in reversed(item.items()))
            else:
                ops.append((parent, key, _Open(number, 1)))
                stack.extend((number, None, v) for v in reversed(item))
            nodes += 1
        if nodes >= piece_nodes:
            pieces.append(pickle.dumps(ops, protocol=pickle.HIGHEST_PROTOCOL))
            ops, nodes = [], 0
    if ops:
        pieces.append(pickle.dumps(ops, protocol=pickle.HIGHEST_PROTOCOL))
    return pieces


async def unpack(pieces: list[bytes]) -> Any:
    """The value :func:`pack` split into ``pieces``, unpickled a piece per loop turn."""
    made: dict[int, Any] = {}
    root: Any = None
    for number, piece in enumerate(pieces):
        if number:
            await asyncio.sleep(0)
        for parent, key, item in pickle.loads(piece):  # noqa: S301 - our own worker's pickles
            value = item
            if type(item) is _Open:
                value = made[item.made] = {} if item.kind == 0 else []
            if parent < 0:
                root = value
                continue
            container = made[parent]
            if type(container) is list:
                container.append(value)
            else:
                container[key] = value
    return root
