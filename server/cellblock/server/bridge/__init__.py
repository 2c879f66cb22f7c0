"""The host end of the bridge: one gRPC server per cell on its own socket."""

from cellblock.server.bridge._server import MAX_BRIDGE_MESSAGE_BYTES, CellBridge

__all__ = ["MAX_BRIDGE_MESSAGE_BYTES", "CellBridge"]
