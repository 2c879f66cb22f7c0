"""Choosing the run store from ``CELLBLOCK_STORE`` (SPEC §16.1 item 1)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

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
    """The URL without credentials, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def make_run_store(url: str, cap: int) -> RunStore:
    """Builds (does not open) the store a ``CELLBLOCK_STORE`` value names.

    Args:
        url: ``memory:``, ``sqlite:///<absolute path>`` (``sqlite:///relative`` is refused)
            or ``postgresql://…`` / ``postgres://…`` (libpq URL).
        cap: The deployment's suspended-run cap.

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

        return PostgresRunStore(url, cap)
    raise StoreUnavailableError(f"CELLBLOCK_STORE={describe_store(url)!r} names no run store; use sqlite:///<path>, postgresql://… or memory:")
