"""Choosing the run store from ``CELLBLOCK_STORE`` (SPEC §16.1 item 1)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cellblock.server.limits import DEFAULT_STORE_CALL_MS
from cellblock.server.store._base import RunStore, StoreUnavailableError

#: File name of the default SQLite store inside ``CELLBLOCK_STATE_DIR``.
DEFAULT_SQLITE_NAME = "runs.sqlite3"


def default_state_dir(env: dict[str, str] | None = None) -> str:
    """``CELLBLOCK_STATE_DIR``'s default: ``$XDG_STATE_HOME/cellblock``, else ``~/.local/state/cellblock``."""
    env = dict(os.environ if env is None else env)
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "cellblock")


def default_store_url(state_dir: str) -> str:
    """The default ``CELLBLOCK_STORE``: ``sqlite:///<state_dir>/runs.sqlite3``."""
    return "sqlite:///" + str(Path(state_dir, DEFAULT_SQLITE_NAME).absolute()).lstrip("/")


def describe_store(url: str) -> str:
    """The URL without credentials, for logs: the password in the authority and in ``?password=``.

    A URL that does not parse is shown as its scheme alone (it may hold a password).
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url.split(":", 1)[0] + ":<unparseable>"
    shown = url
    if password is not None:
        shown = shown.replace(f":{password}@", ":***@", 1)
    if parts.query:
        fields = [(k, "***" if k.lower() == "password" else v) for k, v in (f.partition("=")[::2] for f in parts.query.split("&"))]
        shown = shown.replace("?" + parts.query, "?" + "&".join(f"{k}={v}" for k, v in fields), 1)
    return shown


def make_run_store(url: str, cap: int, call_s: float = DEFAULT_STORE_CALL_MS / 1000.0) -> RunStore:
    """Builds (does not open) the store a ``CELLBLOCK_STORE`` value names.

    Args:
        url: ``memory:``, ``sqlite:///<absolute path>`` (the path after ``sqlite:///`` is always
            taken as absolute: ``sqlite:///var/x.db`` and ``sqlite:////var/x.db`` both name ``/var/x.db``)
            or ``postgresql://…`` / ``postgres://…`` (libpq URL).
        cap: The deployment's suspended-run cap.
        call_s: The store wait in seconds. ``RunRegistry`` bounds each whole call by it; PostgreSQL's
            own timeouts are set from it (:class:`PostgresRunStore`). SQLite keeps its busy timeout
            (``BUSY_TIMEOUT_S``): a call that outlived the wait ends on the store's thread.

    Raises:
        StoreUnavailableError: The value names no known store.
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if url == "memory:":
        from cellblock.server.store._memory import MemoryRunStore  # noqa: PLC0415

        return MemoryRunStore(cap)
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) <= len("sqlite:///"):
            raise StoreUnavailableError(f"CELLBLOCK_STORE={url!r}: write sqlite:///<absolute path to the database file>")
        from cellblock.server.store._sqlite import SqliteRunStore  # noqa: PLC0415

        return SqliteRunStore("/" + unquote(url[len("sqlite:///") :]).lstrip("/"), cap)
    if scheme in ("postgresql", "postgres"):
        from cellblock.server.store._postgres import PostgresRunStore  # noqa: PLC0415

        return PostgresRunStore(url, cap, call_s=call_s)
    raise StoreUnavailableError(f"CELLBLOCK_STORE={describe_store(url)!r} names no run store; use sqlite:///<path>, postgresql://… or memory:")
