"""Exceptions of the cellblock client.

Every exception the client raises on purpose derives from `CellblockError`::

    CellblockError
     ├── RPCError                     a gRPC call failed (``.status``, ``.message``)
     │    ├── InvalidArgumentError      INVALID_ARGUMENT: missing scope fields, malformed registration
     │    ├── NotFoundError             NOT_FOUND: unknown catalog or run (or another scope's)
     │    ├── FailedPreconditionError   FAILED_PRECONDITION: Exec/Wait in a scope without a catalog
     │    ├── ResourceExhaustedError    RESOURCE_EXHAUSTED: admission control refused a leg
     │    ├── PermissionDeniedError     PERMISSION_DENIED
     │    ├── UnavailableError          UNAVAILABLE: the service cannot be reached
     │    ├── DeadlineExceededError     DEADLINE_EXCEEDED: the RPC deadline passed
     │    └── InternalError             INTERNAL: a fault inside the service
     ├── ProtocolError                the service broke the stream contract (e.g. no Result)
     └── ToolRefused                  raised by a tool handler to refuse or fail a nested call

Run failures are *not* exceptions: a leg that ends with an error is a
`RunResult` whose ``status`` is ``"failed"``. Caller cancellation stays
`asyncio.CancelledError`, and `grpc.aio.AioRpcError` never reaches users:
`from_grpc_error` is the one place where gRPC status codes become exceptions.

Example::

    try:
        catalog = await client.get_catalog(scope)
    except cellblock.client.NotFoundError:
        catalog = await client.put_catalog(scope, tools)
    except cellblock.client.RPCError as err:
        log.warning("catalog_unavailable", status=err.status.name, message=err.message)
"""

from __future__ import annotations

from typing import ClassVar, Literal, get_args

import grpc

__all__ = [
    "CellblockError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ProtocolError",
    "RPCError",
    "ResourceExhaustedError",
    "ToolErrorKind",
    "ToolRefused",
    "UnavailableError",
    "from_grpc_error",
]

ToolErrorKind = Literal["invalid_input", "blocked", "failed", "cancelled"]
"""How a runtime refuses or fails a nested call (SPEC §3.5 item 5)."""

_GRPC_CODE_TO_EXCEPTION: dict[grpc.StatusCode, type[RPCError]] = {}


class CellblockError(Exception):
    """Base class of every exception raised by the cellblock client."""


class RPCError(CellblockError):
    """A gRPC call to cellblock failed with a non-OK status.

    Subclasses name one status code each; a code without a subclass is raised
    as a plain `RPCError`.

    Attributes:
        status: The gRPC status code.
        message: The service's status message (human-readable, actionable).
    """

    grpc_status_code: ClassVar[grpc.StatusCode | None] = None
    """The status code this class stands for; ``None`` for the base class."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        """Creates the error.

        Args:
            status: The gRPC status code of the failed call.
            message: The status message sent by the service.
        """
        super().__init__(f"{status.name}: {message}" if message else status.name)
        self.status = status
        self.message = message

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("grpc_status_code")
        if code is not None:
            if code in _GRPC_CODE_TO_EXCEPTION:
                raise TypeError(f"{code.name} is already mapped to {_GRPC_CODE_TO_EXCEPTION[code].__name__}")
            _GRPC_CODE_TO_EXCEPTION[code] = cls


class InvalidArgumentError(RPCError):
    """The request was malformed: missing scope fields, bad registration, bad stream start."""

    grpc_status_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(RPCError):
    """The catalog or run does not exist, expired, or belongs to another scope."""

    grpc_status_code = grpc.StatusCode.NOT_FOUND


class FailedPreconditionError(RPCError):
    """The scope is not ready for the call, e.g. `exec` before any catalog was registered."""

    grpc_status_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(RPCError):
    """Admission control refused to start a leg; no run was created. Retry later."""

    grpc_status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PermissionDeniedError(RPCError):
    """The caller is not allowed to make the call."""

    grpc_status_code = grpc.StatusCode.PERMISSION_DENIED


class UnavailableError(RPCError):
    """The service cannot be reached (connection refused, shutting down, not ready in time)."""

    grpc_status_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(RPCError):
    """The RPC's deadline passed before the service answered."""

    grpc_status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class InternalError(RPCError):
    """The service hit an unexpected fault."""

    grpc_status_code = grpc.StatusCode.INTERNAL


class ProtocolError(CellblockError):
    """The service broke the stream contract, e.g. an Exec stream closed without a Result."""


class ToolRefused(CellblockError):  # noqa: N818 - a refusal, not an error of the client
    """Raised by a tool handler to refuse or fail a nested call.

    The client answers the `ToolCall` with ``ToolResult(error=ToolError(kind,
    message))`` instead of a value. Any other exception raised by a handler is
    sent as kind ``"failed"`` with the exception's message.

    Example::

        async def shipping_quote(input: dict, call: ToolCallInfo) -> dict:
            if input["tons"] <= 0:
                raise ToolRefused("invalid_input", "tons must be positive")
            ...

    Attributes:
        kind: ``"invalid_input"`` (the tool refused its input; uncaught, the run
            fails with ``invalid_input``), ``"blocked"`` (policy or approval
            stopped the call; the message is the reason), ``"failed"`` or
            ``"cancelled"``.
        message: The text the guest program sees as the rejection's message.
    """

    def __init__(self, kind: ToolErrorKind, message: str) -> None:
        """Creates the refusal.

        Args:
            kind: One of ``"invalid_input"``, ``"blocked"``, ``"failed"``,
                ``"cancelled"``.
            message: The message the guest sees; should be non-empty.

        Raises:
            ValueError: If ``kind`` is not one of the four kinds.
        """
        if kind not in get_args(ToolErrorKind):
            raise ValueError(f"unknown tool error kind {kind!r}; use one of {', '.join(get_args(ToolErrorKind))}")
        super().__init__(f"{kind}: {message}")
        self.kind: ToolErrorKind = kind
        self.message = message


def from_grpc_error(error: grpc.RpcError) -> RPCError:
    """Translates a gRPC error into the matching `RPCError` subclass.

    This is the only place where gRPC status codes become client exceptions.

    Args:
        error: The error raised by grpc, normally a `grpc.aio.AioRpcError`.

    Returns:
        An instance of the class registered for the status code, or a plain
        `RPCError` for codes without a class of their own.
    """
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    status = code_fn() if callable(code_fn) else None
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    message = details_fn() if callable(details_fn) else None
    cls = _GRPC_CODE_TO_EXCEPTION.get(status, RPCError)
    return cls(status, message or "")
