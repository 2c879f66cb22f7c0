"""A worker's large JSON-like result, pickled in pieces unpickled one at a time while the loop runs (SPEC §3.1 item 6).

A worker call's result is unpickled by the pool's thread in the service process, holding
Python's lock: the loop thread waits meanwhile. A registration's decoded tools (3,000 host
tools of 5 KB, or one 22 MB schema) are hundreds of thousands of small objects, and their
unpickling held the lock 64-154 ms at once. :func:`pack` (in the worker) turns such a value
into pickles of about :data:`PIECE_NODES` nodes each, which the pool's thread reads as
plain ``bytes`` (a copy); :func:`unpack` unpickles them in a thread, a piece at a time, handing
the lock back to the loop between pieces, and puts the value back together.

Only ``dict`` and ``list`` containers are split; any other value (and any container of at
most :data:`PIECE_NODES` nodes) travels whole. Sharing between parts of the value is not
kept (JSON values have none).
"""

from __future__ import annotations

import asyncio
import pickle
import time
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
            pieces.append(_piece(ops))
            ops, nodes = [], 0
    if ops:
        pieces.append(_piece(ops))
    return pieces


def _piece(ops: list[_Op]) -> bytes:
    """One piece: its parents, keys and values as three lists (no tuple per step for the loop's collector to count)."""
    parents, keys, values = zip(*ops, strict=True)
    return pickle.dumps((list(parents), list(keys), list(values)), protocol=pickle.HIGHEST_PROTOCOL)


async def unpack(pieces: list[bytes]) -> Any:
    """The value :func:`pack` split into ``pieces``, put together in a thread (:func:`assemble`) while the loop runs."""
    return await asyncio.to_thread(assemble, pieces)


def assemble(pieces: list[bytes]) -> Any:
    """The value :func:`pack` split into ``pieces``.

    Each piece's unpickling holds Python's lock about a millisecond; between them (and every
    5 ms of the joining) the lock goes back to the loop. The garbage collector's runs that the
    new objects trigger run in this thread, as they did when the pool's thread unpickled the
    value whole: run on the loop, a full collection after 1,500 mcp tools held it 51-72 ms.
    """
    made: dict[int, Any] = {}
    root: Any = None
    for piece in pieces:
        parents, keys, values = pickle.loads(piece)  # noqa: S301 - our own worker's pickles
        for parent, key, item in zip(parents, keys, values, strict=True):
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
        time.sleep(0)  # hands the lock over now
    return root
