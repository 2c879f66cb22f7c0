"""The gRPC server's HTTP/2 keepalive policy (README "Keepalive")."""

from __future__ import annotations

__all__ = ["KEEPALIVE_MAX_PING_STRIKES", "keepalive_options"]

#: Pings inside the permitted interval tolerated before the server sends GOAWAY.
KEEPALIVE_MAX_PING_STRIKES = 2


def keepalive_options(min_ping_interval_ms: int) -> list[tuple[str, int]]:
    """The server's HTTP/2 keepalive policy (README "Keepalive").

    gRPC servers by default refuse client pings more frequent than every
    5 minutes while no data flows, and answer the third early one with
    ``GOAWAY``: a client pinging every 10 s (a common default) loses its
    stream in the middle of a long leg that waits on a tool.

    Args:
        min_ping_interval_ms: The shortest accepted interval between pings
            while the server sends no data, in milliseconds (at least 1).

    Returns:
        grpc server options: pings permitted without calls, the interval,
        and the strike limit.
    """
    return [
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", max(1, int(min_ping_interval_ms))),
        ("grpc.http2.max_ping_strikes", KEEPALIVE_MAX_PING_STRIKES),
    ]
