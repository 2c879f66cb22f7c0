"""The gRPC services of cellblock.v1."""

from cellblock.server.api._catalog_service import CatalogService
from cellblock.server.api._code_mode_service import CodeModeService
from cellblock.server.api._failures import FailureInterceptor
from cellblock.server.api._run_service import RunService
from cellblock.server.api._state import Admission, ServiceState

__all__ = ["Admission", "CatalogService", "CodeModeService", "FailureInterceptor", "RunService", "ServiceState"]
