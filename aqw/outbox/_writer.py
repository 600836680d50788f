"""Writing outbox rows on the caller's connection, inside the caller's transaction.

The connection is an asyncpg connection (or pool connection), a psycopg 3
``AsyncConnection``, or an SQLAlchemy ``AsyncConnection`` / ``AsyncSession`` (over asyncpg
or psycopg); no driver is imported here: the connection is told apart by its class's
module. A row is the job's wire form, its queue and when it is due; the insert trigger
notifies the relay at commit. Nothing is written outside a transaction (an asyncpg
connection with none open, or a psycopg or SQLAlchemy one in autocommit, is refused in
one line): a row that commits on its own is an enqueue, not an outbox write.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..job import Job
from ._sql import pending_migrations_error, statement

_DOLLAR = re.compile(r"\$(\d+)")
#: SQLSTATE of an undefined table.
_UNDEFINED_TABLE = "42P01"
_ACCEPTED = (
    "an asyncpg connection, a psycopg AsyncConnection, or an SQLAlchemy "
    "AsyncConnection or AsyncSession"
)


def _driver(conn: Any) -> str:
    module = type(conn).__module__
    top = module.split(".")[0]
    if top in ("asyncpg", "psycopg"):
        return top
    if module.startswith("sqlalchemy.ext.asyncio.") and (
        hasattr(conn, "sync_session") or hasattr(conn, "sync_connection")
    ):
        return "sqlalchemy"
    raise ConfigError(f"enqueue conn= must be {_ACCEPTED}, got {module}.{type(conn).__qualname__}")


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver's error, or of the driver error an SQLAlchemy one wraps."""
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if state is None and (orig := getattr(exc, "orig", None)) is not None:
        state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state if isinstance(state, str) else None


async def write_rows(
    conn: Any, schema: str, queue: str, jobs: Sequence[Job], run_at: float | None
) -> None:
    """Insert one outbox row per job of ``queue`` on ``conn``, in its open transaction."""
    sql = statement("insert", schema)
    rows = [(queue, job.encode(), run_at) for job in jobs]
    driver = _driver(conn)
    try:
        if driver == "asyncpg":
            if not conn.is_in_transaction():
                raise ConfigError(
                    "enqueue conn=: the connection has no open transaction (async with "
                    "conn.transaction(): ...), so the job would not commit with anything"
                )
            if len(rows) == 1:
                await conn.execute(sql, *rows[0])
            else:
                await conn.executemany(sql, rows)
        elif driver == "psycopg":  # %s placeholders; not in autocommit, it opens one itself
            if conn.autocommit and conn.info.transaction_status == 0:  # IDLE: none open
                raise ConfigError(
                    "enqueue conn=: the psycopg connection is in autocommit mode with no "
                    "transaction open, so the job would not commit with anything: use "
                    "async with conn.transaction(): ..."
                )
            pct = _DOLLAR.sub("%s", sql)
            async with conn.cursor() as cur:
                await cur.executemany(pct, rows)
        else:
            await _write_sqlalchemy(conn, sql, rows)
    except Exception as exc:
        if _sqlstate(exc) == _UNDEFINED_TABLE:
            raise pending_migrations_error(schema) from None
        raise


async def _write_sqlalchemy(
    conn: Any, sql: str, rows: list[tuple[str, bytes, float | None]]
) -> None:
    """The rows through an SQLAlchemy ``AsyncConnection`` or ``AsyncSession``: a text
    statement with named binds, whatever the driver's own placeholders. An SQLAlchemy 2
    connection begins a transaction by itself ("commit as you go"), so the rows commit with
    the caller's next commit, or never; only an AUTOCOMMIT connection is refused."""
    from sqlalchemy import text  # the conn came from SQLAlchemy, so it is installed

    if hasattr(conn, "sync_session"):  # AsyncSession: its connection, in its transaction
        conn = await conn.connection()
    if conn.sync_connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        raise ConfigError(
            "enqueue conn=: the SQLAlchemy connection is in AUTOCOMMIT isolation, so the "
            "job would not commit with anything: use a transaction (engine.begin())"
        )
    named = text(_DOLLAR.sub(r":p\1", sql))
    params = [{"p1": queue, "p2": job, "p3": run_at} for queue, job, run_at in rows]
    await conn.execute(named, params[0] if len(params) == 1 else params)
