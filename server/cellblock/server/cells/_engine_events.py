"""The Docker engine's event stream for one executor's cells: liveness without a round trip.

A pooled or kept cell must still run, unpaused, when a leg takes it. Asking the
engine (``docker inspect``) costs a round trip to the engine on every pool hit;
instead the executor follows the engine's event stream, filtered to its own
cells (``io.cellblock.instance``), from one thread. A cell the stream reported
nothing about since before it was created (only ``create``, ``start`` and ``update``) still
runs as the engine left it. Any other event about it (``pause``, ``kill`` with
any signal, ``die``, ``oom``, ``stop``, ``exec_*``, ``update``, ...) takes it out
of the set of cells the stream vouches for, for good.

Fail closed: the stream vouches only for cells created while it was subscribed
without a break since (its :attr:`EngineEvents.generation` unchanged); while it
is down (engine restarted, stream broken, not yet subscribed) nothing is vouched
for and callers ask the engine as before. What the engine never reports (a
signal sent to the cell's process from outside the engine) is the bridge's
to catch: a warm cell's bridge pings its agent (``limits.WARM_PING_TIMEOUT_MS``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("cellblock.docker.events")

#: The only events that leave a cell running as it was created: the engine made it and started it,
#: and changed its resource settings (a warm cell's CPU weight once it is ready, :meth:`Cell.serve_ready`).
BENIGN_ACTIONS = frozenset({"create", "start", "update"})
#: Seconds between attempts to subscribe again after the stream broke.
RESUBSCRIBE_S = 1.0


class EngineEvents:
    """Follows the engine's container events for the cells labelled ``label=value``.

    Args:
        api: Returns the docker-py low-level ``APIClient`` (called in the thread).
        label: The label filter, ``"key=value"`` (the executor's instance label).
        cell_label: The label whose value is the cell id.

    Attributes:
        generation: Counts subscriptions; a cell is vouched for only under the
            generation it was registered in.
    """

    def __init__(self, api: Callable[[], Any], label: str, cell_label: str) -> None:
        self._api = api
        self._label = label
        self._cell_label = cell_label
        self.generation = 0
        self._subscribed = False
        #: Cells registered under the current generation and not reported since.
        self._clean: set[str] = set()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._closed = threading.Event()
        #: Set once the stream was first subscribed.
        self._first = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, wait_s: float = 0.0) -> None:
        """Starts following the stream (idempotent); vouches for nothing until subscribed.

        Args:
            wait_s: Seconds to block until the first subscription (0: return at once).
                Cells created before it are never vouched for, so the service's start
                waits for it (blocking: call from a worker thread).
        """
        with self._lock:
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._follow, name="cellblock-docker-events", daemon=True)
                self._thread.start()
        if wait_s > 0:
            self._first.wait(wait_s)

    def register(self, cell_id: str) -> int:
        """Records a cell about to be created; call before the engine creates it.

        Returns:
            The generation to pass to :meth:`vouches_for`, or ``-1`` when the stream is
            not subscribed now (then it never vouches for this cell).
        """
        with self._lock:
            if not self._subscribed:
                return -1
            self._clean.add(cell_id)
            return self.generation

    def forget(self, cell_id: str) -> None:
        """The cell is being removed: it is never vouched for again."""
        with self._lock:
            self._clean.discard(cell_id)

    def vouches_for(self, cell_id: str, generation: int) -> bool:
        """Whether the stream saw nothing but its creation and start since the cell was registered."""
        with self._lock:
            return self._subscribed and generation == self.generation and cell_id in self._clean

    def _follow(self) -> None:
        while not self._closed.is_set():
            try:
                # Subscribed once the call returns: the engine subscribes before it sends the headers.
                stream = self._api().events(decode=True, filters={"type": "container", "label": self._label})
            except Exception as exc:  # noqa: BLE001 - engine unreachable: callers ask it directly
                log.warning("docker.events_unavailable", error=exc.__class__.__name__)
                self._closed.wait(RESUBSCRIBE_S)
                continue
            with self._lock:
                self._stream = stream
                self.generation += 1
                self._subscribed = True
                self._clean.clear()
            self._first.set()
            try:
                for event in stream:
                    self._seen(event)
            except Exception as exc:  # noqa: BLE001 - a broken stream: vouch for nothing until resubscribed
                if not self._closed.is_set():
                    log.warning("docker.events_broken", error=exc.__class__.__name__)
            finally:
                with self._lock:
                    self._subscribed = False
                    self._stream = None
                    self._clean.clear()
                with contextlib.suppress(Exception):
                    stream.close()
            self._closed.wait(RESUBSCRIBE_S)

    def _seen(self, event: dict[str, Any]) -> None:
        action = str(event.get("Action") or event.get("status") or "")
        if action in BENIGN_ACTIONS:
            return
        cell_id = (event.get("Actor") or {}).get("Attributes", {}).get(self._cell_label)
        if cell_id:
            with self._lock:
                self._clean.discard(str(cell_id))

    def close(self) -> None:
        """Stops following the stream (bounded: the thread is a daemon)."""
        self._closed.set()
        with self._lock:
            stream, self._stream, self._subscribed = self._stream, None, False
            self._clean.clear()
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
