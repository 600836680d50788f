"""Writing outbox rows on the caller's connection, inside the caller's transaction.

The connection is an asyncpg connection (or pool connection) or a psycopg 3
``AsyncConnection``; neither driver is imported here: the connection is told apart by its
class's module. A row is the job's wire form, its queue and when it is due; the insert
trigger notifies the relay at commit. Nothing is written outside a transaction (an
asyncpg connection with none open is refused, in one line): a row that commits on its own
is an enqueue, not an outbox write.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..job import Job
from ._sql import pending_migrations_error, statement

_DOLLAR = re.compile(r"\$\d+")
#: SQLSTATE of an undefined table.
_UNDEFINED_TABLE = "42P01"


def _driver(conn: Any) -> str:
    module = type(conn).__module__.split(".")[0]
    if module in ("asyncpg", "psycopg"):
        return module
    raise ConfigError(
        f"enqueue conn= must be an asyncpg connection or a psycopg AsyncConnection, got "
        f"{type(conn).__module__}.{type(conn).__qualname__}"
    )


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
        else:  # psycopg 3: %s placeholders; a connection not in autocommit opens one itself
            if conn.autocommit and conn.info.transaction_status == 0:  # IDLE: none open
                raise ConfigError(
                    "enqueue conn=: the psycopg connection is in autocommit mode with no "
                    "transaction open, so the job would not commit with anything: use "
                    "async with conn.transaction(): ..."
                )
            pct = _DOLLAR.sub("%s", sql)
            async with conn.cursor() as cur:
                await cur.executemany(pct, rows)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) == _UNDEFINED_TABLE:
            raise pending_migrations_error(schema) from None
        raise
