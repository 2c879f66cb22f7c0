"""The gRPC services of cellblock.v1."""

from cellblock.server.services._catalog_service import CatalogService
from cellblock.server.services._code_mode_service import CodeModeService
from cellblock.server.services._run_service import RunService
from cellblock.server.services._state import ServiceState

__all__ = ["CatalogService", "CodeModeService", "RunService", "ServiceState"]
