"""Source: exec/wait argument checks and source preparation (SPEC §5, §6).

The first step of an exec: nothing here holds run state or touches a cell. Modules by
role: ``_input`` (exec/wait arguments, §5), ``_source`` (the preparation pipeline, §6.1),
``_syntax`` (parsing and syntax errors, §6.3, §6.5), ``_typescript`` (type stripping, §6.2),
``_shell`` (shell detection, §6.4), ``_module_access`` (module access, §6.6).
"""

from cellblock.server.source._input import InputFailure, validate_exec, validate_wait
from cellblock.server.source._source import PreparedSource, prepare_source

__all__ = [
    "InputFailure",
    "PreparedSource",
    "prepare_source",
    "validate_exec",
    "validate_wait",
]
