"""The gRPC services of cellblock.v1."""

from cellblock.server.api._catalog_service import CatalogService
from cellblock.server.api._code_mode_service import CodeModeService
from cellblock.server.api._failures import FailureInterceptor
from cellblock.server.api._keepalive import KEEPALIVE_MAX_PING_STRIKES, keepalive_options
from cellblock.server.api._run_service import RunService
from cellblock.server.api._state import Admission, ServiceState

__all__ = [
    "KEEPALIVE_MAX_PING_STRIKES",
    "Admission",
    "CatalogService",
    "CodeModeService",
    "FailureInterceptor",
    "RunService",
    "ServiceState",
    "keepalive_options",
]
