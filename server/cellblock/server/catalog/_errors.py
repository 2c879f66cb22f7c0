"""Catalog exceptions.

Tree::

    Exception
    ├── CatalogRegistrationError   a registration was refused (gRPC INVALID_ARGUMENT)
    └── BridgeReplyError           a host reply that rejects the guest's promise (SPEC §14.4)
"""

from __future__ import annotations

from typing import Literal, TypeAlias

__all__ = ["BridgeReplyError", "CatalogRegistrationError", "Provenance"]

Provenance: TypeAlias = Literal["input", "internal"]


class CatalogRegistrationError(ValueError):
    """A catalog registration was refused; nothing was applied (SPEC §3.2 item 4).

    Maps to gRPC ``INVALID_ARGUMENT``.

    Attributes:
        index: Zero-based index of the offending tool in the registration, or ``None`` when
            the problem is in the registration itself (mode, allow, deny, directToolNames).
        problem: What is wrong, for example ``"name must be a non-empty string"``.
        tool: The offending tool's catalog id, or its name when no id can be formed
            (``None`` when it has neither), so the message names the tool itself.
    """

    def __init__(self, index: int | None, problem: str, tool: str | None = None) -> None:
        self.index = index
        self.problem = problem
        self.tool = tool
        if index is None:
            text = problem
        elif tool is None:
            text = f"tool {index}: {problem}"
        else:
            text = f"tool {index} ({tool}): {problem}"
        super().__init__(text)


class BridgeReplyError(Exception):
    """A host reply that rejects a guest bridge request (SPEC §8.2 item 5, §14.4).

    The guest sees a plain ``Error`` with :attr:`message` (and ``code`` when set). The
    controller records :attr:`provenance` for SPEC §11.3.

    Attributes:
        message: The exact guest-facing message.
        provenance: ``"input"`` for replies with input provenance ([B01]–[B05], [B10], ...):
            uncaught, they end the run with ``invalid_input``. ``"internal"`` for every other
            host reply: uncaught, they end it with ``internal_error``.
        code: The error's ``code`` property, set only for [B10] (``"input_contract"``).
    """

    def __init__(self, message: str, provenance: Provenance = "input", code: str | None = None) -> None:
        self.message = message
        self.provenance: Provenance = provenance
        self.code = code
        super().__init__(message)
