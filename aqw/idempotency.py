"""Completion records in SQL: a job's effect is committed once, in the same transaction.

The broker's completion record (``aqw:{q}:done:<key>`` on Redis) stops a *finished* job from
running again, but it is written at the ack, after the handler's own writes have committed: a
worker that crashes between its commit and its ack leaves a job that runs a second time. The
only way to make the effect itself happen once is to record "this key's effect happened" in
the datastore that holds the effect, in the same transaction, behind a unique constraint::

    store = SqlCompletionStore()              # tables aqw_completions and aqw_fences
    await store.ensure_schema(conn)           # once, at start-up

    @app.task
    async def charge(order: Order, ctx: aqw.Context) -> None:
        async with pool.acquire() as conn, conn.transaction():
            async with store.effect(conn, queue=app.queue, key=ctx.job.key or ctx.job.id,
                                    job_id=ctx.job.id, fencing_token=ctx.fencing_token,
                                    lease=ctx.lease) as first_time:
                if first_time:
                    await conn.execute("INSERT INTO charges ...")

(``context_effect`` fills those arguments from the context.)

Entering the block inserts the completion row with ``INSERT ... ON CONFLICT DO NOTHING
RETURNING``: it yields True the first time and False once the effect has happened (the
handler then writes nothing and returns, and the job is acknowledged). The block runs in a
savepoint of the caller's transaction (or in a transaction of its own when none is open), so
the completion row and the effect commit or roll back together: an error in the block, or a
rollback of the caller's transaction, leaves no record behind.

**Fencing.** A holder paused past its lease's TTL (a GC pause, a stalled VM, a partition) may
wake up and try to commit after another worker took the job over. Every lease carries a
fencing token that grows with each acquisition; before the completion row, the block upserts
the token into a fences table, keeping the highest token seen per (queue, key)::

    INSERT INTO aqw_fences (queue, key, token) VALUES ($1, $2, $3)
    ON CONFLICT (queue, key) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
    WHERE aqw_fences.token <= EXCLUDED.token
    RETURNING token

No row back means a newer holder has already been here: ``aqw.LeaseLost`` is raised,
which aborts the block (and, when it propagates, the caller's transaction). The upserted row
stays locked until the caller commits, so a newer holder's block waits for the older one to
commit or roll back and then sees its completion row: whichever order the two arrive in, the
effect is written once and a stale writer never commits after a newer one. When a
``aqw.Lease`` is passed, it is also checked locally on entry and on exit (lost, or past
its confirmed expiry) so a holder that knows it lost its lease fails fast.

Rows stay until ``SqlCompletionStore.purge`` removes them; they are the datastore's truth
and usually outlive the broker's completion records (``App(idempotency_ttl=...)``).

asyncpg is the driver (the ``postgres`` extra); this module does not import it, any
object with asyncpg's ``execute``, ``fetchval``, ``fetchrow`` and ``transaction`` works.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from .errors import ConfigError, LeaseLost
from .job import Job
from .lease import Lease

__all__ = ["SqlCompletionStore", "context_effect", "default_store"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _quote(name: str) -> str:
    """``name`` or ``schema.name`` as a quoted SQL identifier; raises ConfigError if unsafe."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(_IDENT.match(p) for p in parts):
        raise ConfigError(
            f"invalid SQL table name {name!r}: use [schema.]name of letters, digits and "
            "underscores (at most 63 each, not starting with a digit)"
        )
    return ".".join(f'"{p}"' for p in parts)


def _default_fence_table(table: str) -> str:
    schema, _, name = table.rpartition(".")
    base = name.removesuffix("_completions") if name.endswith("_completions") else name
    fences = f"{base}_fences"
    return f"{schema}.{fences}" if schema else fences


class SqlCompletionStore:
    """Completion records and fencing tokens in PostgreSQL, written in the caller's transaction.

    Args:
        table: the completions table (``[schema.]name``); default ``aqw_completions``.
        fence_table: the fences table; default: ``table`` with its ``_completions`` suffix
            replaced by ``_fences`` (``aqw_fences``), or ``<table>_fences``.

    Columns of the completions table: ``queue``, ``key``, ``job_id``, ``fencing_token``,
    ``completed_at`` with ``PRIMARY KEY (queue, key)``; of the fences table: ``queue``,
    ``key``, ``token`` (the highest fencing token seen), ``updated_at``.
    """

    def __init__(self, table: str = "aqw_completions", *, fence_table: str | None = None) -> None:
        self.table = table
        self.fence_table = fence_table or _default_fence_table(table)
        self._t = _quote(self.table)
        self._f = _quote(self.fence_table)
        if self._t == self._f:
            raise ConfigError("SqlCompletionStore: table and fence_table must differ")
        index = self.table.rpartition(".")[2][:50] + "_completed_at_idx"
        self._index = _quote(index)
        self._lock_id = f"aqw-schema:{self.table}"
        self._sql_fence = (
            f"INSERT INTO {self._f} AS f (queue, key, token) VALUES ($1, $2, $3) "
            "ON CONFLICT (queue, key) DO UPDATE SET token = EXCLUDED.token, updated_at = now() "
            "WHERE f.token <= EXCLUDED.token RETURNING f.token"
        )
        self._sql_complete = (
            f"INSERT INTO {self._t} (queue, key, job_id, fencing_token) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (queue, key) DO NOTHING RETURNING true"
        )

    def __repr__(self) -> str:
        return f"<SqlCompletionStore table={self.table!r} fence_table={self.fence_table!r}>"

    # -- schema ----------------------------------------------------------------------------

    async def ensure_schema(self, conn: Any) -> None:
        """Create both tables (and an index on ``completed_at``) if they do not exist.

        Safe to run from many workers at once: creation is serialised by an advisory lock.
        """
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self._lock_id)
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._t} ("
                " queue text NOT NULL,"
                " key text NOT NULL,"
                " job_id text NOT NULL,"
                " fencing_token bigint NOT NULL DEFAULT 0,"
                " completed_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (queue, key))"
            )
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS {self._index} ON {self._t} (completed_at)"
            )
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self._f} ("
                " queue text NOT NULL,"
                " key text NOT NULL,"
                " token bigint NOT NULL,"
                " updated_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (queue, key))"
            )

    async def drop_schema(self, conn: Any) -> None:
        """Drop both tables (for tests and teardown)."""
        await conn.execute(f"DROP TABLE IF EXISTS {self._t}, {self._f}")

    # -- the effect block ------------------------------------------------------------------

    def effect(
        self,
        conn: Any,
        *,
        queue: str,
        key: str,
        job_id: str,
        fencing_token: int,
        lease: Lease | None = None,
        check_fence: bool = True,
    ) -> AbstractAsyncContextManager[bool]:
        """Guard an effect: ``async with store.effect(conn, ...) as first_time:``.

        Yields True when this is the first time ``(queue, key)`` completes (write the effect
        in the block), False when it completed before (write nothing). Runs in a savepoint of
        ``conn``'s open transaction, or in its own transaction when none is open; the
        completion row commits with the caller's transaction and not before.

        Args:
            conn: an asyncpg connection (or pool connection).
            queue: the queue the job belongs to.
            key: what identifies the effect: the job's idempotency key, or its id.
            job_id: the id of the job writing it (stored for inspection).
            fencing_token: the job lease's fencing token.
            lease: the lease itself; when given, a lease that is lost or past its confirmed
                expiry raises ``aqw.LeaseLost`` on entry and on exit.
            check_fence: compare ``fencing_token`` with the highest token stored for
                ``(queue, key)`` and raise ``aqw.LeaseLost`` when it is lower.

        Raises:
            LeaseLost: a newer holder has been here, or ``lease`` is no longer held. Nothing
                of the block is kept.
        """
        if not queue or not key or not job_id:
            raise ConfigError("effect(): queue, key and job_id must be non-empty strings")
        if not isinstance(fencing_token, int) or fencing_token < 0:
            raise ConfigError(f"effect(): fencing_token must be an int >= 0, got {fencing_token!r}")
        return self._effect(conn, queue, key, job_id, fencing_token, lease, check_fence)

    @contextlib.asynccontextmanager
    async def _effect(
        self,
        conn: Any,
        queue: str,
        key: str,
        job_id: str,
        token: int,
        lease: Lease | None,
        check_fence: bool,
    ) -> AsyncIterator[bool]:
        what = f"{queue}/{key}"
        _check_lease(lease, what)
        async with conn.transaction():  # a savepoint inside the caller's transaction
            if check_fence:
                stored = await conn.fetchval(self._sql_fence, queue, key, token)
                if stored is None:
                    newest = await conn.fetchval(
                        f"SELECT token FROM {self._f} WHERE queue = $1 AND key = $2", queue, key
                    )
                    raise LeaseLost(
                        lease.key if lease is not None else what,
                        f"fencing token {token} is stale: a newer holder (token {newest}) "
                        f"has written to {what}",
                    )
            first_time = bool(await conn.fetchval(self._sql_complete, queue, key, job_id, token))
            yield first_time
            _check_lease(lease, what)

    # -- inspection and upkeep -------------------------------------------------------------

    async def completion(self, conn: Any, *, queue: str, key: str) -> dict[str, Any] | None:
        """The completion row of ``(queue, key)`` as a dict, or None when it has not completed."""
        row = await conn.fetchrow(
            f"SELECT queue, key, job_id, fencing_token, completed_at FROM {self._t} "
            "WHERE queue = $1 AND key = $2",
            queue,
            key,
        )
        return None if row is None else dict(row)

    async def is_completed(self, conn: Any, *, queue: str, key: str) -> bool:
        """True when the effect of ``(queue, key)`` has been committed."""
        return bool(
            await conn.fetchval(
                f"SELECT EXISTS (SELECT 1 FROM {self._t} WHERE queue = $1 AND key = $2)",
                queue,
                key,
            )
        )

    async def purge(self, conn: Any, older_than: float, *, queue: str | None = None) -> int:
        """Delete completion rows and fences older than ``older_than`` seconds (of one queue,
        or all); returns how many completion rows went. Keep ``older_than`` well above the
        longest time a job can stay queued or redelivered, and above any lease's lifetime."""
        if older_than < 0:
            raise ConfigError(f"purge(older_than): must be >= 0 seconds, got {older_than!r}")
        cutoff = time.time() - older_than
        async with conn.transaction():
            status = await conn.execute(
                f"DELETE FROM {self._t} WHERE completed_at < to_timestamp($1) "
                "AND ($2::text IS NULL OR queue = $2)",
                cutoff,
                queue,
            )
            await conn.execute(
                f"DELETE FROM {self._f} WHERE updated_at < to_timestamp($1) "
                "AND ($2::text IS NULL OR queue = $2)",
                cutoff,
                queue,
            )
        return int(str(status).rsplit(" ", 1)[-1] or 0)


def _check_lease(lease: Lease | None, what: str) -> None:
    if lease is None:
        return
    lapsed = lease.lapsed()
    if lapsed is None:
        return
    if lease.lost_reason is None and lease.expires_in <= 0:
        lapsed = "the lease is past its confirmed expiry (renewals stalled)"
    raise LeaseLost(lease.key, f"cannot commit the effect of {what}: {lapsed}")


#: The store ``context_effect`` uses when none is given (tables ``aqw_completions`` and
#: ``aqw_fences``).
default_store = SqlCompletionStore()


class EffectContext(Protocol):
    """What ``context_effect`` needs of a job's context (``aqw.Context``)."""

    @property
    def job(self) -> Job: ...
    @property
    def lease(self) -> Lease | None: ...
    @property
    def fencing_token(self) -> int: ...
    @property
    def queue(self) -> str: ...


def context_effect(
    ctx: EffectContext,
    conn: Any,
    store: SqlCompletionStore | None = None,
    *,
    key: str | None = None,
) -> AbstractAsyncContextManager[bool]:
    """``SqlCompletionStore.effect`` for the job running in ``ctx``.

    ``queue`` is the app's queue, ``key`` defaults to the job's idempotency key or else its
    id, ``job_id`` and ``fencing_token`` come from the job and its lease, and the lease is
    checked on entry and exit. Pass ``key=`` to guard several distinct effects of one job.
    """
    if key is not None and not key:
        raise ConfigError("ctx.effect(key=...): key must be a non-empty string")
    job = ctx.job
    return (store or default_store).effect(
        conn,
        queue=ctx.queue,
        key=key or job.key or job.id,
        job_id=job.id,
        fencing_token=ctx.fencing_token,
        lease=ctx.lease,
    )
