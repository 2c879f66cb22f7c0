"""Fixed limits and constants of the service: one home for each (SPEC §2.3).

The first part is the table of SPEC §2.3, in its order; the second holds the service's other fixed
limits. Sizes shared with the guest agent (snapshot chunk, largest bridge message) and the cell's
exit codes are enums of the bridge proto (``cellblock.bridge.v1.BridgeLimit`` and ``CellExitCode``),
so that host and guest read one definition. Settings a deployment chooses are in
:mod:`cellblock.server.config`.
"""

from __future__ import annotations

from cellblock.bridge.v1 import bridge_service_pb2 as _bridge

# --- SPEC §2.3 ------------------------------------------------------------------------------

SUSPENDED_RUN_CAP = 64
"""Default suspended (or tool-waiting) runs allowed in the whole deployment, counted in the run store
(``CELLBLOCK_MAX_SUSPENDED_RUNS`` overrides it, SPEC §16.1 item 5); quoted by [R01]."""


def scope_share(limit: int) -> int:
    """Most of a shared ``limit`` (legs, suspended-run slots) one scope may hold: three quarters, at least 1.

    A quarter always stays for the other scopes, so one tenant cannot starve every other one (SPEC §3.1 item 2,
    §16.1 item 5).
    """
    return max(1, limit - limit // 4)

WATCHDOG_GRACE_MS = 2000
"""Grace after a leg's deadline before the watchdog kills the cell, in milliseconds."""

QUICK_INDEX_MAX_CHARS = 8000
"""Upper bound of the quick index block, in characters (code points)."""

INPUT_HINT_MAX_CHARS = 300
"""Longest input hint, in characters."""

INPUT_HINT_MAX_DEPTH = 4
"""Schema depth at which input hint rendering stops."""

INPUT_HINT_MAX_PROPERTIES = 16
"""Most properties rendered per object in an input hint."""

OUTPUT_HINT_MAX_CHARS = 850
"""Longest output hint, in characters."""

OUTPUT_HINT_MAX_DEPTH = 6
"""Schema depth at which output hint rendering stops."""

OUTPUT_HINT_MAX_PROPERTIES = 20
"""Most properties rendered per object in an output hint."""

HINT_PROPERTY_NAME_MAX_CHARS = 128
"""Longest property name a hint renders, in characters."""

STRUCTURAL_UNION_MAX_VARIANTS = 4
"""Most variants of a structural (non-literal) union in a hint."""

LITERAL_UNION_MAX_VALUES = 8
"""Most values of a literal union in a hint."""

LITERAL_UNION_MAX_CHARS = 96
"""Longest literal union text in a hint, in characters."""

SYNTAX_ERROR_MESSAGE_MAX_CHARS = 240
"""Parser message kept in a syntax error ([S02], SPEC §6.5), in characters."""

UNKNOWN_ID_SUGGESTIONS = 3
"""Suggestions named by an unknown-tool reply."""

USER_STACK_FRAMES = 10
"""User stack frames kept in an error (SPEC §8.10). Applied in the guest's ``controller.js``, which
cannot import Python: its literal must equal this (tests/unit/test_limits.py checks it)."""

DESCRIPTION_MAX_SERVERS = 20
"""MCP servers named in the exec description's namespace section."""

OUTPUT_MARKER_RESERVE_BYTES = 256
"""Bytes of the output budget reserved for truncation markers."""

BM25_K1 = 1.2
"""BM25 term-frequency saturation parameter."""

BM25_B = 0.75
"""BM25 document-length normalisation parameter."""


def min_resume_budget_ms(timeout_ms: int) -> int:
    """Returns the minimum resume budget of a leg.

    Args:
        timeout_ms: The run's per-leg timeout in milliseconds.

    Returns:
        ``min(250, max(1, floor(timeout_ms / 2)))`` in milliseconds.
    """
    return min(250, max(1, timeout_ms // 2))


def value_reserve_bytes(max_output_bytes: int) -> int:
    """Returns the part of the output budget reserved for the value or error.

    Args:
        max_output_bytes: The run's output budget in bytes.

    Returns:
        ``floor(max_output_bytes / 4)`` bytes.
    """
    return max_output_bytes // 4


def bridge_message_bytes(max_output_bytes: int, memory_limit_bytes: int, max_snapshot_bytes: int) -> int:
    """Returns the largest bridge message a cell's transport reads for one run (SPEC §2.3).

    The larger of the output budget and the reply inbox (a request's arguments may fill the
    inbox), plus one bridge chunk. The cell's gRPC server refuses a longer message before
    reading it, so the host never buffers more.

    Args:
        max_output_bytes: The run's output budget ``B`` in bytes.
        memory_limit_bytes: The run's cell memory limit in bytes.
        max_snapshot_bytes: The run's snapshot limit in bytes.
    """
    return max(max_output_bytes, reply_inbox_bytes(memory_limit_bytes, max_snapshot_bytes)) + _bridge.BRIDGE_LIMIT_SNAPSHOT_CHUNK_BYTES


def reply_inbox_bytes(memory_limit_bytes: int, max_snapshot_bytes: int) -> int:
    """Returns the largest bridge payload accepted in either direction.

    Args:
        memory_limit_bytes: The run's cell memory limit in bytes.
        max_snapshot_bytes: The run's snapshot limit in bytes.

    Returns:
        ``min(memory_limit_bytes, max_snapshot_bytes)`` bytes.
    """
    return min(memory_limit_bytes, max_snapshot_bytes)


MAX_SOURCE_BYTES = 1024 * 1024
"""Upper end of the program size bound, in UTF-8 bytes; quoted by [E09]."""


def max_source_bytes(memory_limit_bytes: int) -> int:
    """Returns the program size bound of a run.

    A program must compile inside the cell's heap, where its bytecode and
    constants take several times its text.

    Args:
        memory_limit_bytes: The run's engine heap limit in bytes.

    Returns:
        ``min(1048576, floor(memory_limit_bytes / 16))`` UTF-8 bytes.
    """
    return min(MAX_SOURCE_BYTES, memory_limit_bytes // 16)


def max_guest_catalog_bytes(memory_limit_bytes: int) -> int:
    """Returns the largest guest catalog (the ``Start`` message's catalog JSON) a cell installs at a memory limit.

    The cell holds the catalog's text, its parsed form and the strings the controller builds
    from it: installing an 11.3 MB catalog took 36 MB of linear memory, and a 30 MB one did
    not fit 64 MiB (SPEC §3.2 item 8, [C04]).

    Args:
        memory_limit_bytes: A cell memory limit in bytes.

    Returns:
        ``floor(memory_limit_bytes / 4)`` UTF-8 bytes (16 MiB at the default 64 MiB).
    """
    return memory_limit_bytes // 4


# --- Other fixed limits ---------------------------------------------------------------------

ECHO_MAX_CHARS = 200
"""Guest text echoed in a message (a path, id, name or selector), in characters (SPEC §14)."""

ATTACH_TIMEOUT_S = 30.0
"""How long the host waits for a started cell to attach to its bridge, in seconds."""

BRIDGE_HELLO_TIMEOUT_S = 2.0
"""How long a bridge connection may take to authenticate (its first message, ``hello``), in seconds (SPEC §16.3 item 2)."""

MAX_API_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest gRPC message of the public API, either direction, in bytes."""

MAX_TOOLS_PER_REQUEST = 10_000
"""Most tools one catalog registration request may carry."""

MAX_SCOPE_ID_CHARS = 256
"""Longest id field of any public RPC request (scope ids, tool-call, turn, run, model ids), in
characters; longer is [A03] (SPEC §3.1 item 5)."""

MAX_TOOL_IDENTIFIER_CHARS = 256
"""Longest tool ``owner``, ``name`` or ``label`` a registration may give, in characters; longer is
[C03] (SPEC §3.2 item 3). Catalog ids (``source:owner:name``) are copied into every log line of a
tool call, so they must stay bounded."""

_LONGEST_SOURCE_CHARS = len("client")
"""The longest tool ``source`` (``host``, ``mcp``, ``client``; ``catalog.SOURCES``, compared by a unit test)."""

MAX_CATALOG_ID_CHARS = _LONGEST_SOURCE_CHARS + 1 + MAX_TOOL_IDENTIFIER_CHARS + 1 + MAX_TOOL_IDENTIFIER_CHARS
"""Longest id a catalog can hold (``source:owner:name``, 520 characters); a longer id text names no entry
(neither an id nor a name), so it is [B07] at once, with no suggestions (SPEC §7.6 item 4)."""

SUGGESTION_BUDGET_MS = 15
"""Wall time the [B07] suggestions of one unknown id text may take on the event loop, milliseconds; when it is
spent the suggestions are those of the entries scored so far (SPEC §7.6 item 4)."""

SUGGESTION_CHECK_EVERY = 32
"""Entries scored between two reads of the clock while suggestions are computed."""

SUGGESTION_DESCRIPTION_CHARS = 1024
"""Characters of an entry's description that suggestion scoring searches (SPEC §7.6 item 2)."""

LISTED_NAMES_MAX = 20
"""Most argument names one [B10] list names (then ``, ...``), each cut to :data:`ECHO_MAX_CHARS` (SPEC §14.4)."""

MAX_SEARCH_QUERY_CHARS = 4096
"""Longest ``tools.search`` query, in characters; longer is [B28] (SPEC §7.5 item 1)."""

# --- Many tenants, one service (issue 11; SPEC §2.3, §3.1 items 4-6) -----------------------------

SOURCE_BUDGET_MS = 5000
"""Time source preparation may take in a worker process, milliseconds ([S05])."""

REGISTRATION_BUDGET_MS = 30000
"""Time one registration's schema processing may take in a worker process, milliseconds ([C01])."""

CONTRACT_BUDGET_MS = 20
"""CPU time one input or output contract check may take on the event loop's thread, milliseconds
([B10]; wall time spent waiting for a core on a loaded machine does not count)."""

MAX_SCHEMA_DEPTH = 128
"""Deepest nesting of arrays and objects a registered schema may have (JSON levels)."""

MAX_VALUE_DEPTH = 256
"""Deepest nesting of arrays and objects of a value that crosses a cell's bridge (JSON levels).

Each value the cell's controller serialises (the final value, each argument of a bridge
request, an output entry's or a ``yield_control`` reason's value) is refused deeper (SPEC
§8.8 rule 7): the engine's ``JSON.stringify`` recurses with no stack check and traps at about
12,000 levels, ``String()`` of an array at about 750. The host reads and writes every value
at this depth on each of its paths (its deepest-recursing one, the writer of floats that
``json.dumps`` spells differently, stops near 300 under the interpreter's recursion limit of
1000). ``controller.js`` writes this number itself (``MAX_VALUE_DEPTH``); a unit test
compares the two.

The host counts the same bound as its second layer, for a tampered cell: on each such value
it reads (``catalog.strict_json(text, max_depth)``, counted on the text by
``catalog.nests_deeper``, never by the recursion limit) a request's arguments (the array
holding them one level more; on the loop or in a worker) get [B23], a final value [R15], an
output entry is dropped and logged (SPEC §8.4 item 6).
"""

MAX_RESULT_DEPTH = MAX_VALUE_DEPTH + 1
"""Deepest nesting of a runtime's tool result the host delivers to a cell (JSON levels, [B29] deeper).

The result object holding a ``details`` value at :data:`MAX_VALUE_DEPTH` (SPEC §3.4 item 5):
whatever the guest is given it could send on (§8.8 rule 7), and the host reads it exactly at
any depth past it (``strict_json(text, MAX_RESULT_DEPTH)``), never "not valid JSON".
"""

SMALL_JOB_CHARS = 16 * 1024
"""Worker inputs up to this many characters use the small lane of the worker pool."""

INLINE_JSON_CHARS = 64 * 1024
"""Longest nested-call argument or tool result text read on the event loop; longer ones are read,
checked and written in a worker process (``runs._large_json``; dense JSON costs the loop about
30 ms per MB to read and write, and a float-heavy one up to 150 ms)."""

LARGE_JSON_BUDGET_MS = 30000
"""Time a worker may take to read and check one long argument or tool result text, milliseconds
([B25], [B26]; a nested call's input also within its leg's deadline). Wall time, queueing and a
worker's start included: on a 2-core machine at load 38 a 2.3 MB text overran 5 s that way, while
its reading takes milliseconds of CPU."""

REPEAT_BURST = 20
"""Warnings of one kind a leg writes in full before they are sampled (SPEC §13 item 8)."""

REPEAT_SAMPLE = 1000
"""After the burst, one warning of a kind in this many is written, with its count."""

DEFAULT_CELL_WAIT_MS = 10_000
"""Default bound on waiting for a cell (start and attach), ``CELLBLOCK_CELL_WAIT_MS`` ([R21])."""

DEFAULT_STORE_CALL_MS = 5000
"""Default store wait, ``CELLBLOCK_STORE_CALL_MS``: longest wait for one run-store call an answer depends on ([R25], SPEC §16.1 item 9)."""

MAX_BRIDGE_ID_CHARS = 256
"""Longest bridge id echoed back in a protocol rejection (real ids are ``bridge:<method>:<n>``)."""

CELL_STATE_CHECK_S = 2.0
"""Seconds the engine may take to report a cell's state (running, paused, OOMKilled)."""

VERDICT_S = 0.5
"""Seconds a leg whose cell never attached within the cell wait asks the engine whether it still runs; no answer: [R21]."""

POOL_CLOSE_S = 30.0
"""Seconds the warm pool waits at shutdown for cells still starting."""

WARM_PING_INTERVAL_MS = 1000
"""How often the host pings a warm cell over its bridge (an HTTP/2 PING on the cell's connection), in milliseconds."""

WARM_PING_TIMEOUT_MS = 3000
"""How long a ping may go unanswered before the host closes the warm cell's bridge stream (the pool then discards it), in milliseconds."""

LOOP_TICK_MS = 5
"""Sleep of the event loop monitor between wake-ups, milliseconds (``cellblock.loop.hold``)."""

LOOP_HOLD_RECORD_MS = 5
"""Shortest loop hold recorded in the ``cellblock.loop.hold`` histogram, milliseconds."""

LOOP_HOLD_LOG_MS = 250
"""Shortest loop hold logged as ``loop.held`` (a step that should run off the loop), milliseconds."""
