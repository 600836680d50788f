"""The records of idempotency keys in PostgreSQL (``records=postgresql://...``): one row per
(queue, key) in table ``aqw_sqs_keys``, created if missing::

    queue text, key text, job_id text,
    state text,               -- 'pending' (claimed, not yet sent), 'queued', 'done'
    expires_at timestamptz,   -- the key is taken while expires_at > now()
    PRIMARY KEY (queue, key)

Every step is one statement (``INSERT ... ON CONFLICT``, so concurrent claims of one key
queue behind its row lock and exactly one wins), timed by the database's clock. An expired
row is taken over in place; rows expired for a minute are deleted, a thousand at a time, at
most every five minutes per process. asyncpg is the driver (the optional 'postgres' extra):
this module is imported only when a ``records=`` URL asks for PostgreSQL."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from ...errors import ConfigError
from ..messages import ScheduleMark
from ._errors import RecordsUnavailable

T = TypeVar("T")

TABLE = "aqw_sqs_keys"
#: The table of the periodic tasks' schedule marks, beside the keys' (``<table>_marks``).
MARKS_SUFFIX = "_marks"
PURGE_EVERY = 300.0  # seconds between two purges of expired rows, per process
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

#: Errors that mean "the database cannot be reached right now".
_UNREACHABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
)
#: Errors that mean "the records= URL is wrong": bad DSN, refused login, no such database.
_MISTAKES: tuple[type[BaseException], ...] = (
    asyncpg.ClientConfigurationError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
    ValueError,
)


def quote_name(name: str) -> str:
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(_IDENT.match(p) for p in parts):
        raise ConfigError(f"records= table {name!r}: use [schema.]name of letters, digits, _")
    return ".".join(f'"{p}"' for p in parts)


class PostgresKeyStore:
    """``KeyStore`` on PostgreSQL; its pool (1-``max_size`` connections) opens on first use,
    and creates the table if it is missing."""

    def __init__(self, dsn: str, table: str = TABLE, *, max_size: int = 10) -> None:
        self.dsn = dsn
        self.table = table
        self.max_size = max_size
        t = self._t = quote_name(table)
        m = self._m = quote_name(table + MARKS_SUFFIX)
        self._index = quote_name(table.rpartition(".")[2][:50] + "_expires_at_idx")
        self._pool: Any = None
        self._opening: asyncio.Lock | None = None
        self._purged = time.monotonic()
        self._sql_claim = (
            f"INSERT INTO {t} AS r (queue, key, job_id, state, expires_at) "
            "VALUES ($1, $2, $3, 'pending', now() + make_interval(secs => $4)) "
            "ON CONFLICT (queue, key) DO UPDATE SET job_id = EXCLUDED.job_id, "
            "state = EXCLUDED.state, expires_at = EXCLUDED.expires_at "
            "WHERE r.expires_at <= now() RETURNING r.job_id"
        )
        self._sql_holder = (
            f"SELECT job_id FROM {t} WHERE queue = $1 AND key = $2 AND expires_at > now()"
        )
        # A job that completed before its producer confirmed keeps its 'done'.
        self._sql_confirm = (
            f"INSERT INTO {t} AS r (queue, key, job_id, state, expires_at) "
            "VALUES ($1, $2, $3, 'queued', now() + make_interval(secs => $4)) "
            "ON CONFLICT (queue, key) DO UPDATE SET job_id = EXCLUDED.job_id, "
            "state = CASE WHEN r.state = 'done' AND r.expires_at > now() "
            "AND r.job_id = EXCLUDED.job_id THEN 'done' ELSE 'queued' END, "
            "expires_at = CASE WHEN r.job_id = EXCLUDED.job_id "
            "THEN greatest(r.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END "
            "WHERE r.job_id = EXCLUDED.job_id OR r.expires_at <= now() RETURNING true"
        )
        self._sql_release = (
            f"DELETE FROM {t} WHERE queue = $1 AND key = $2 AND job_id = $3 AND state = 'pending'"
        )
        self._sql_complete = (
            f"INSERT INTO {t} AS r (queue, key, job_id, state, expires_at) "
            "VALUES ($1, $2, $3, 'done', now() + make_interval(secs => $4)) "
            "ON CONFLICT (queue, key) DO UPDATE SET job_id = EXCLUDED.job_id, state = 'done', "
            "expires_at = greatest(r.expires_at, EXCLUDED.expires_at)"
        )
        self._sql_completed = (
            f"SELECT EXISTS (SELECT 1 FROM {t} WHERE queue = $1 AND key = $2 "
            "AND state = 'done' AND expires_at > now())"
        )
        # A mark moves only forward: a paused ex-leader never moves it back.
        self._sql_advance = (
            f"INSERT INTO {m} AS r (queue, task, tick, job_id) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (queue, task) DO UPDATE SET tick = EXCLUDED.tick, "
            "job_id = EXCLUDED.job_id WHERE r.tick <= EXCLUDED.tick"
        )
        self._sql_marks = f"SELECT task, tick, job_id FROM {m} WHERE queue = $1"
        self._sql_purge = (
            f"DELETE FROM {t} WHERE (queue, key) IN (SELECT queue, key FROM {t} "
            "WHERE expires_at < now() - interval '1 minute' LIMIT 1000 FOR UPDATE SKIP LOCKED)"
        )

    def __repr__(self) -> str:
        return f"<PostgresKeyStore table={self.table!r}>"

    # -- the pool and the schema ---------------------------------------------------------------

    async def _open(self) -> Any:
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                pool = await asyncpg.create_pool(
                    self.dsn, min_size=1, max_size=self.max_size, command_timeout=10
                )
                try:
                    await self.ensure_schema(pool)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
        return self._pool

    async def ensure_schema(self, pool: Any) -> None:
        """Create the table and its index if missing (serialised by an advisory lock)."""
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"aqw:{self.table}")
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._t} ("
                " queue text NOT NULL,"
                " key text NOT NULL,"
                " job_id text NOT NULL,"
                " state text NOT NULL,"
                " expires_at timestamptz NOT NULL,"
                " PRIMARY KEY (queue, key))"
            )
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS {self._index} ON {self._t} (expires_at)"
            )
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._m} ("
                " queue text NOT NULL,"
                " task text NOT NULL,"
                " tick double precision NOT NULL,"
                " job_id text NOT NULL,"
                " PRIMARY KEY (queue, task))"
            )

    async def pool(self) -> Any:
        """The pool (opened, and the keys' tables made, on first use)."""
        return await self._open()

    async def run(self, call: Callable[[Any], Awaitable[T]]) -> T:
        """``call(pool)``, its unreachable store as ``RecordsUnavailable`` and a wrong URL as
        ``ConfigError`` (the batch counts' steps go through it too)."""
        return await self._run(call)

    async def _run(self, call: Callable[[Any], Awaitable[T]]) -> T:
        try:
            pool = await self._open()
            return await call(pool)
        except _UNREACHABLE as exc:
            raise RecordsUnavailable(f"records= store (PostgreSQL) unreachable: {exc!r}") from exc
        except _MISTAKES as exc:
            raise ConfigError(f"records= store (PostgreSQL) refused: {exc}") from exc

    async def _purge(self, pool: Any) -> None:
        if time.monotonic() - self._purged < PURGE_EVERY:
            return
        self._purged = time.monotonic()
        await pool.execute(self._sql_purge)

    # -- KeyStore --------------------------------------------------------------------------------

    async def claim(self, queue: str, key: str, job_id: str, ttl: float) -> str | None:
        async def claim(pool: Any) -> str | None:
            await self._purge(pool)
            for _ in range(10):  # a holder that expires (or is released) between the two
                if await pool.fetchval(self._sql_claim, queue, key, job_id, float(ttl)):
                    return None
                holder = await pool.fetchval(self._sql_holder, queue, key)
                if holder is not None:
                    return str(holder)
            raise RecordsUnavailable(f"records= store: key {key!r} changed hands 10 times")

        return await self._run(claim)

    async def confirm(self, queue: str, key: str, job_id: str, ttl: float) -> bool:
        return bool(
            await self._run(
                lambda pool: pool.fetchval(self._sql_confirm, queue, key, job_id, float(ttl))
            )
        )

    async def release(self, queue: str, key: str, job_id: str) -> None:
        await self._run(lambda pool: pool.execute(self._sql_release, queue, key, job_id))

    async def complete(self, queue: str, key: str, job_id: str, ttl: float) -> None:
        await self._run(
            lambda pool: pool.execute(self._sql_complete, queue, key, job_id, float(ttl))
        )

    async def is_completed(self, queue: str, key: str) -> bool:
        return bool(await self._run(lambda pool: pool.fetchval(self._sql_completed, queue, key)))

    # -- schedule marks (``MarkStore``) ---------------------------------------------------------

    async def read_marks(self, queue: str) -> dict[str, ScheduleMark]:
        rows = await self._run(lambda pool: pool.fetch(self._sql_marks, queue))
        return {str(r["task"]): ScheduleMark(float(r["tick"]), str(r["job_id"])) for r in rows}

    async def advance_mark(self, queue: str, task: str, mark: ScheduleMark) -> None:
        sql, tick = self._sql_advance, float(mark.tick)
        await self._run(lambda pool: pool.execute(sql, queue, task, tick, mark.job_id))

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
