"""A throwaway PostgreSQL cluster for tests: Debian's ``initdb``/``pg_ctl``, a unix socket in a temp dir.

Not a mock: a real server, started per use and removed afterwards. ``make test``
installs the server first (``scripts/ensure-postgres.sh``). As root, the cluster
runs as the unprivileged ``postgres`` user (``initdb`` refuses root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def postgres_bin() -> str:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with ``initdb`` and ``pg_ctl``.

    Raises:
        RuntimeError: PostgreSQL is not installed (run ``scripts/ensure-postgres.sh``).
    """
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not found:
        raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin; run scripts/ensure-postgres.sh")
    return os.path.dirname(found[-1])


@dataclass(frozen=True)
class Cluster:
    """A running throwaway cluster.

    Attributes:
        dsn: ``postgresql://postgres@/postgres?host=<socket dir>`` (unix socket only, no TCP).
        data_dir: The cluster's directory.
    """

    dsn: str
    data_dir: str
    socket_dir: str

    def database(self, name: str) -> str:
        """Creates database ``name`` and returns its DSN."""
        self._psql(f'CREATE DATABASE "{name}"')
        return self.dsn.replace("/postgres?", f"/{name}?")

    def _psql(self, sql: str) -> None:
        _as_owner([os.path.join(postgres_bin(), "psql"), "-h", self.socket_dir, "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql])


def _as_owner(argv: list[str]) -> None:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


@contextmanager
def throwaway_cluster(prefix: str = "cellblock-pg-", durable: bool = False) -> Iterator[Cluster]:
    """Starts a cluster in a new temp dir; stops it and removes the dir on exit.

    Args:
        prefix: Prefix of the temp dir's name.
        durable: Keep PostgreSQL's fsync on (benchmarks); tests turn it off for speed,
            which changes nothing they check (a killed *client* process, not the server).
    """
    bindir = postgres_bin()
    root = tempfile.mkdtemp(prefix=prefix)
    data, sock = os.path.join(root, "data"), os.path.join(root, "sock")
    os.mkdir(sock)
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in (root, sock):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chmod(root, 0o755)
    try:
        _as_owner([os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        options = f"-c listen_addresses='' -c unix_socket_directories={sock} -c max_connections=100" + ("" if durable else " -c fsync=off")
        _as_owner([os.path.join(bindir, "pg_ctl"), "-D", data, "-l", os.path.join(root, "server.log"), "-o", options, "-w", "-t", "60", "start"])
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {exc.stderr.decode(errors='replace')[-400:]}") from exc
    try:
        yield Cluster(dsn=f"postgresql://postgres@/postgres?host={sock}", data_dir=data, socket_dir=sock)
    finally:
        subprocess.run(
            (["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []) + [os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)
