"""What the service logs of ``CELLBLOCK_STORE``: never a credential, never a crash (SPEC §16.1 item 1)."""

from __future__ import annotations

import pytest

from cellblock.server.store import describe_store


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db.example:5432/cellblock", "postgresql://app:***@db.example:5432/cellblock"),
        # libpq also takes the password as a query parameter.
        ("postgresql://app@db.example/cellblock?password=s3cret&sslmode=require", "postgresql://app@db.example/cellblock?password=***&sslmode=require"),
        ("postgresql:///cellblock?host=/run/postgresql&PASSWORD=s3cret", "postgresql:///cellblock?host=/run/postgresql&PASSWORD=***"),
        ("sqlite:///var/lib/cellblock/runs.sqlite3", "sqlite:///var/lib/cellblock/runs.sqlite3"),
        ("memory:", "memory:"),
    ],
)
def test_credentials_are_masked(url: str, shown: str) -> None:
    assert describe_store(url) == shown


def test_a_malformed_url_is_described_without_raising_or_leaking() -> None:
    shown = describe_store("postgresql://app:s3cret@[::1/cellblock")
    assert "s3cret" not in shown and shown.startswith("postgresql:")
