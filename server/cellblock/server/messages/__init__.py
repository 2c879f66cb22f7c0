"""Exact model-facing message texts of SPEC §14: the one home of every §14 text.

Every text here is normative: tests compare them byte for byte. The texts only the guest
produces ([B13], [B15], [B22], and [B14] when the guest refuses first) are written in
``controller.js``, which cannot import Python; integration and guest tests compare them. One naming scheme: the
SPEC id in upper case (``E01``, ``B04``) for a fixed text, in lower case (``e05()``,
``b07()``) for a function that fills a text's placeholders. Echoed guest text (`<text>`,
`<name>`, `<path>`, `<selector>`, and the `<tool>` of R03) is cut to
:data:`~cellblock.server.limits.ECHO_MAX_CHARS` characters by :func:`echo`, which also escapes its
lone UTF-16 surrogates (:mod:`._unicode`, SPEC §0.3 item 7).

The texts of §14.4 (host replies) and §14.5 (bridge protocol) live in :mod:`._replies` and are
re-exported here: callers import every §14 text from this package.
"""

from __future__ import annotations

from cellblock.server.limits import MAX_SCOPE_ID_CHARS, SUSPENDED_RUN_CAP, SYNTAX_ERROR_MESSAGE_MAX_CHARS

from ._replies import *  # noqa: F403 (the §14.4-§14.5 texts, listed in _replies.__all__)
from ._replies import echo
from ._unicode import escape_lone_surrogates as escape_lone_surrogates
from ._unicode import has_lone_surrogate as has_lone_surrogate

# §14.1 exec and wait arguments (invalid_input, phase input).
E01 = "exec input must be a JSON object."
E02 = "code and command must be identical when both are given; send the program in code."
E03 = "code must be a non-empty string (command is accepted as an alias)."
E04 = 'language must be "javascript" or "typescript".'
E06 = (
    "type checking is not supported: TypeScript is only type-stripped before it runs. "
    "Remove the typecheck field."
)
E07 = "restartSafe must be true or false."
E08 = "code mode is disabled on this cellblock service."
E10 = "exec input is nested too deeply to read; send a JSON object whose code field is a string."
E11 = (
    "code holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair), which cannot be sent to the cell; "
    "write it as a \\u escape inside a JavaScript string literal instead."
)


def e09(source_bytes: int, limit_bytes: int) -> str:
    """[E09]: the program is larger than the program size bound (SPEC §2.3)."""
    return f"the program is {source_bytes} bytes, more than the {limit_bytes}-byte program limit; send a shorter program and fetch large data with tools."


def e05(language: str) -> str:
    """Returns [E05] for a language disabled by the ``languages`` setting.

    Args:
        language: ``"javascript"`` or ``"typescript"``.
    """
    return f"{language} cells are disabled by this service's languages setting."


W01 = "wait input must be a JSON object."
W02 = "runId must be a non-empty string."
W03 = "this run is unknown or has expired; start a new exec instead of waiting."
W04 = "this run belongs to a different session; only the session that started it can wait on it."
W05 = "this run belongs to a different agent run; only the agent run that started it can wait on it."
W06 = "this run is already being resumed by another wait; let that call return first."
W07 = "wait input is nested too deeply to read; send a JSON object whose runId field is a string."
W08 = f"runId is longer than {MAX_SCOPE_ID_CHARS} characters; pass the runId of the waiting result unchanged."
W09 = "runId holds a lone UTF-16 surrogate, which no run id has; pass the runId of the waiting result unchanged."

# §14.2 Source preparation (invalid_input, phase input).
S01 = (
    "exec runs JavaScript or TypeScript, not shell commands, and this source looks like a shell "
    "command line. Send a JavaScript program in code (command is only an alias of code); find "
    "tools with ALL_TOOLS or tools.search and do shell, file or network work through a catalog "
    "tool with tools.callValue(id, args). Do not resend the same shell text."
)

S03_CONSTRUCTS = ("enum", "namespace", "parameter property", "import alias", "export =")
"""The allowed ``<construct>`` values of [S03]."""


def s02(line: int, column: int, parser_message: str) -> str:
    """Returns [S02] for the first syntax error of a source.

    Args:
        line: 1-based line in the submitted source.
        column: 1-based column in UTF-16 code units.
        parser_message: The parser's message; cut here to 240 characters.
    """
    message = parser_message[:SYNTAX_ERROR_MESSAGE_MAX_CHARS]
    return (
        f"SyntaxError at cellblock:user.js:{line}:{column}: {message}. "
        "No tools were called; fix the source and send it again."
    )


def s03(line: int, column: int, construct: str) -> str:
    """Returns [S03] for TypeScript that needs code generation.

    Args:
        line: 1-based line in the submitted source.
        column: 1-based column in UTF-16 code units.
        construct: One of :data:`S03_CONSTRUCTS`.

    Raises:
        ValueError: ``construct`` is not one of :data:`S03_CONSTRUCTS`.
    """
    if construct not in S03_CONSTRUCTS:
        raise ValueError(f"unknown S03 construct: {construct!r}")
    return (
        f"TypeScript at cellblock:user.js:{line}:{column} needs code generation ({construct}), "
        "but cellblock only removes types. No tools were called; rewrite it as plain JavaScript "
        "and send it again."
    )


S04 = (
    "module access is disabled: cells cannot use import, export, import(), import.meta or "
    "require(). No tools were called; use tools or the MCP namespace instead."
)


def s05(budget_ms: int) -> str:
    """[S05]: source preparation overran its budget of ``budget_ms`` (SPEC §2.3)."""
    return f"source preparation took longer than its {budget_ms} ms budget: the program is too large or too deeply nested to check. No tools were called; send a shorter program."


S06 = "source preparation stopped before it finished checking this program; no tools were called. Send a shorter or simpler program."

# §14.6 RPC failures (gRPC status details).

A01 = "the request message could not be decoded (a string field is not valid UTF-8, or a field is malformed)."
A02 = "internal error: the service failed while handling this request; it was logged."
A05 = "the run store did not answer within the store wait (CELLBLOCK_STORE_CALL_MS); nothing was changed by this request's unanswered step. Try again shortly."


def a04(kind: str) -> str:
    """[A04]: a second start message on an ``Exec`` or ``Wait`` stream (``kind``: ``"exec"`` or ``"wait"``; ``INVALID_ARGUMENT``)."""
    return f"the {kind.capitalize()} stream already had its start message; send start once, as the stream's first message. The leg was ended."


def a03(field: str, max_length: int) -> str:
    """[A03]: the request field ``field`` is longer than the id cap ``max_length`` (``INVALID_ARGUMENT``)."""
    return f"{field} is longer than {max_length} characters."


# §14.6 Registration (gRPC INVALID_ARGUMENT of PutCatalog).


def c01(budget_ms: int) -> str:
    """[C01]: a registration's schema processing overran ``budget_ms`` (SPEC §2.3)."""
    return f"registration refused: processing its schemas took longer than the {budget_ms} ms budget; register smaller or simpler schemas. Nothing was applied."


C02 = "registration refused: its schemas stopped the schema checker before it finished; register smaller or simpler schemas. Nothing was applied."



def c04(catalog_bytes: int, bound: int) -> str:
    """[C04]: the catalog's guest data is larger than a cell at the default memory limit installs (SPEC §3.2 item 8)."""
    return (
        f"registration refused: the catalog's guest data would be {catalog_bytes} bytes, more than the {bound} bytes a cell installs at the default"
        " memory limit; register fewer or smaller tool schemas. Nothing was applied."
    )


c03 = a03
"""[C03]: a tool's ``owner``, ``name`` or ``label`` longer than its cap (SPEC §3.2 item 3); the text of [A03]."""

# §14.3 Run outcomes.
def r01(cap: int) -> str:
    """Returns [R01] for the deployment's suspended-run cap ``cap`` (SPEC §16.1 item 5)."""
    return f"too many runs are suspended or waiting on tools in this cellblock deployment (limit {cap}); finish waiting runs before starting new ones."


R01 = r01(SUSPENDED_RUN_CAP)


def r23(share: int, cap: int) -> str:
    """Returns [R23]: the run's scope already holds ``share``, its most, of the deployment's ``cap`` suspended-run slots (SPEC §16.1 item 5)."""
    return f"this scope already holds {share} of the deployment's {cap} suspended-run slots, its most; wait on or cancel its waiting runs before starting new ones."


R02 = "restartSafe runs cannot call MCP namespace tools; nothing was called. Run it again without restartSafe."


def r03(tool: str) -> str:
    """Returns [R03] for a restart-safe run that asked for a non-replay-safe call.

    Args:
        tool: The requested id text, or the guest path of a namespace call; cut to
            200 characters.
    """
    return (
        f'restartSafe runs may only make replay-safe read calls, and "{echo(tool)}" is not '
        "replay-safe; nothing was called. Run it again without restartSafe."
    )


R04 = "the program's result can never settle: its promise is still pending, but no tool call, timer or yield is outstanding."


def r05(timeout_ms: int) -> str:
    """Returns [R05] for a guest still computing at the leg's deadline.

    Args:
        timeout_ms: The run's ``timeoutMs`` in milliseconds.
    """
    return f"timeout exceeded: the program was still running when its {timeout_ms} ms budget ran out."


def r06(timeout_ms: int) -> str:
    """Returns [R06] for a cell killed by the watchdog (``timeout_ms``: the run's ``timeoutMs`` in milliseconds)."""
    return f"timeout exceeded: the cell did not stop within {timeout_ms} ms plus 2000 ms grace and was killed."


R07 = "execution aborted by the caller; the cell was stopped and this run cannot be resumed."
R08 = "execution aborted because the session's runs were closed; this run cannot be resumed."


def r21(cell_wait_ms: int) -> str:
    """[R21]: no cell was ready within the cell wait ``cell_wait_ms`` (``CELLBLOCK_CELL_WAIT_MS``)."""
    return f"cell runtime unavailable: the service is busy and no cell was ready within {cell_wait_ms} ms; the program did not run. Try again shortly."


def r24(wait_ms: int) -> str:
    """[R24]: no worker started preparing the source within the wait ``wait_ms`` (the cell wait, ``CELLBLOCK_CELL_WAIT_MS``)."""
    return f"cell runtime unavailable: the service is busy and no worker could start preparing the program within {wait_ms} ms; the program did not run. Try again shortly."


R25 = "cell runtime unavailable: the run store did not answer within the store wait (CELLBLOCK_STORE_CALL_MS); the run was ended and what it held is released once the store answers. Try again shortly."
R26 = "cell runtime unavailable: the run store did not answer within the store wait (CELLBLOCK_STORE_CALL_MS); the run was not resumed and stays suspended. Wait on it again shortly."
R22 = "internal error: the service failed while running this leg; the run was ended and what it held was released."
R20 = "execution aborted because this cellblock service is shutting down; the cell was stopped and this run cannot be resumed."


def aborted(reason: str) -> str:
    """The abort message for a cancel reason: [R08] ``scope``, [R20] ``shutdown``, else [R07]."""
    return R08 if reason == "scope" else R20 if reason == "shutdown" else R07


def r09(memory_limit_bytes: int) -> str:
    """Returns [R09] for a cell that ran out of memory.

    Args:
        memory_limit_bytes: The run's ``memoryLimitBytes`` in bytes.
    """
    return (
        f"cell memory exhausted: the program needed more than its {memory_limit_bytes}-byte "
        "limit. Page through large tool results or keep less data in the cell. Tool calls that "
        "already ran were not undone; check them before retrying."
    )


R10 = (
    "cell engine stopped: recursion exhausted the engine's native stack. Use less recursion, "
    "for example a loop. Tool calls that already ran were not undone; check them before retrying."
)


def cell_stopped_before_attach(cell_wait_ms: int) -> str:
    """The [R11] reason for a fresh cell the engine no longer runs (paused or stopped) when its attach wait of ``cell_wait_ms`` ended."""
    return f"the cell failed to start: within {cell_wait_ms} ms it never attached, and it is no longer running (paused or stopped); it was removed and the program did not run"


def r11(reason: str) -> str:
    """Returns [R11] for a cell that cannot start.

    Args:
        reason: Short host-side reason (not guest text), without a final period.
    """
    return f"cell runtime unavailable: {reason}."


def r12(exit_code: int) -> str:
    """Returns [R12] for a cell that exited with a non-zero code.

    Args:
        exit_code: The container's exit code.
    """
    return f"cell runtime unavailable: the cell exited with code {exit_code}."


R13 = "cell runtime unavailable: the cell exited with code 0 before returning a result."


def r14(snapshot_bytes: int, max_snapshot_bytes: int) -> str:
    """Returns [R14] for a snapshot over ``maxSnapshotBytes``.

    Args:
        snapshot_bytes: Size of the serialised VM in bytes.
        max_snapshot_bytes: The run's ``maxSnapshotBytes`` in bytes.
    """
    return (
        f"snapshot limit exceeded: the suspended program needs {snapshot_bytes} bytes, more "
        f"than maxSnapshotBytes ({max_snapshot_bytes}). Keep less data alive across awaits."
    )


def r15(reason: str) -> str:
    """Returns [R15] for a final value that cannot be serialised (or read), for a short ``reason`` such as ``"nesting is too deep"``."""
    return f"output limit exceeded: the return value could not be serialised into a bounded result ({reason})."


def too_large_to_read(max_bytes: int) -> str:
    """The [R15] reason when the cell ended without a result the host read (a message over ``max_bytes`` is refused unread)."""
    return f"the cell ended without a result the host could read; a final message over {max_bytes} bytes is refused unread, so return less data"


R16 = "the run could not be suspended because its expiry time cannot be represented."
R17 = "internal error: the cell sent an invalid response."


def r18(reason: str) -> str:
    """Returns [R18] for a snapshot that could not be restored.

    Args:
        reason: Short host-side reason.
    """
    return f"cell runtime unavailable: the suspended program could not be restored ({reason})."


R19 = "cell runtime unavailable: the suspended program was made by a different cell image and cannot be restored here."
