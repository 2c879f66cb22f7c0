"""OpenTelemetry metrics of cellblock (API only; DESIGN.md §5).

Instruments are created once, on the global meter. Before the entry point
installs a ``MeterProvider`` they are no-ops (the API's proxy meter hands
them to the real provider once one is set).

Instruments:
    ``cellblock.code_mode.legs``: Exec and Wait legs, by ``cellblock.rpc.kind``,
        ``cellblock.run.status`` and ``error.type`` (the SPEC §11.1 code).
    ``cellblock.cell.start.duration``: seconds from asking the executor for a
        cell to the guest attaching to its bridge.
    ``cellblock.bridge.calls``: bridge requests by ``cellblock.bridge.method``
        (``search``, ``describe``, ``call``).
    ``cellblock.snapshot.size``: stored snapshot sizes in bytes.
    ``cellblock.runs.suspended``: runs parked with a snapshot, per instance.
    ``cellblock.loop.hold``: event loop holds of 5 ms or more, in seconds
        (:mod:`cellblock.server.telemetry._loop`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from opentelemetry import metrics

from cellblock.server.telemetry import _attributes as attr

if TYPE_CHECKING:
    from cellblock.server.runs import RunRegistry

_meter = metrics.get_meter("cellblock.server")

_legs = _meter.create_counter("cellblock.code_mode.legs", unit="{leg}", description="Exec and Wait legs by outcome.")
_cell_start = _meter.create_histogram("cellblock.cell.start.duration", unit="s", description="Time from asking for a cell to its guest attaching.")
_bridge_calls = _meter.create_counter("cellblock.bridge.calls", unit="{request}", description="Bridge requests of guests by method.")
_snapshot_size = _meter.create_histogram("cellblock.snapshot.size", unit="By", description="Sizes of stored snapshots.")

#: Registries whose parked runs the gauge reports (one per service instance).
_registries: weakref.WeakSet[RunRegistry] = weakref.WeakSet()


def _observe_suspended(_options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
    # Each registry reports the deployment-wide count its last sweep read from the run store.
    total = max((reg.counts[1] for reg in list(_registries)), default=0)
    yield metrics.Observation(total)


_meter.create_observable_gauge(
    "cellblock.runs.suspended", callbacks=[_observe_suspended], unit="{run}", description="Runs parked with a snapshot in the deployment's run store, as of the last sweep."
)


def record_leg(kind: str, status: str, code: str) -> None:
    """Counts one finished Exec or Wait leg.

    Args:
        kind: ``exec`` or ``wait``.
        status: ``completed``, ``waiting`` or ``failed``.
        code: The SPEC §11.1 error code, or ``""``.
    """
    _legs.add(1, {attr.RPC_KIND: kind, attr.RUN_STATUS: status, attr.ERROR_TYPE: code or "none"})


def record_cell_start(seconds: float, executor: str) -> None:
    """Records one cell's start latency in seconds."""
    _cell_start.record(seconds, {attr.EXECUTOR: executor})


def record_bridge_call(method: str, requests: int = 1) -> None:
    """Counts ``requests`` bridge requests (``search``, ``describe`` or ``call``)."""
    _bridge_calls.add(requests, {attr.BRIDGE_METHOD: method})


def record_snapshot(size_bytes: int) -> None:
    """Records the size in bytes of one stored snapshot."""
    _snapshot_size.record(size_bytes)


def observe_registry(registry: RunRegistry) -> None:
    """Adds a service instance's registry to the suspended-runs gauge."""
    _registries.add(registry)
