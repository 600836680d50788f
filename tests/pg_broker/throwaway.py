"""A throwaway PostgreSQL 15 cluster for the tests that restart the server: initdb in a
temporary directory owned by ``postgres`` (Debian's initdb and pg_ctl refuse root), trust
auth, fsync off, on a free loopback port; ``restart()`` stops it in immediate mode (a
crash: no checkpoint, recovery at the next start) and starts it again on the same port.
``count_on`` reads a count on a fresh connection, None while the server is away (the
fixture ``server`` in ``conftest.py`` starts a cluster for a test and destroys it)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import asyncpg
import pytest

BIN = Path("/usr/lib/postgresql/15/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayPostgres:
    def __init__(self) -> None:
        if not (BIN / "initdb").exists():
            pytest.skip(f"no PostgreSQL 15 binaries in {BIN}")
        self.root = Path(tempfile.mkdtemp(prefix="aqw-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.log = self.root / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            [*self._as, *argv], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        # Room for the chaos runs: four workers' pools, their replacements', and the
        # sessions of killed ones the server has not yet seen go (100 by default).
        opts = (
            f"-F -p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=300"
        )
        ctl = str(BIN / "pg_ctl")
        self._run(ctl, "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop("immediate")
        self.start()

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError):  # not running
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


async def count_on(dsn: str, sql: str, *args: object) -> int | None:
    """A count on a fresh connection; None while the server is not answering."""
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
        return None
    try:
        return int(await conn.fetchval(sql, *args))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return None
    finally:
        await conn.close()
