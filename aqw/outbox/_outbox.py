"""``aqw.outbox.Outbox``: the database an app's transactional enqueues write to and its
relay reads."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError, extra_hint
from ..job import Job
from ._sql import check_schema, migrate, migration_sql, pending_migrations_error, statement
from ._writer import write_rows

#: SQLSTATE of an undefined table.
_UNDEFINED_TABLE = "42P01"


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """The rows not relayed yet, and the age in seconds of the oldest (0 when none)."""

    pending: int
    oldest_age: float


class Outbox:
    """The outbox of an app: ``aqw.App(broker, outbox="postgresql://...")``.

    Args:
        url: the PostgreSQL database the rows are written to (by ``enqueue(..., conn=)``,
            on the caller's connection to it) and read from by the relay. ``?schema=NAME``
            in the URL names the schema (as ``schema`` does).
        schema: the schema of the tables ``aqw_outbox`` and ``aqw_outbox_relay``
            (default ``public``).
        batch: most rows the relay moves in one transaction.
        poll: seconds between two looks at the table when no NOTIFY came.
        leader_ttl: seconds the relay's leader lease lives between renewals.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "public",
        batch: int = 200,
        poll: float = 1.0,
        leader_ttl: float = 3.0,
    ) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"App outbox must be a postgresql:// URL, got {url!r}")
        query = parse_qsl(parts.query)
        schema = dict(query).get("schema", schema)
        self.schema = check_schema(schema)
        self.dsn = urlunsplit(
            parts._replace(query=urlencode([q for q in query if q[0] != "schema"]))
        )
        if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= 10_000:
            raise ConfigError(f"outbox batch must be an integer 1-10000, got {batch!r}")
        for name, value in (("poll", poll), ("leader_ttl", leader_ttl)):
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"outbox {name} must be a number of seconds > 0, got {value!r}")
        self.batch, self.poll, self.leader_ttl = batch, float(poll), float(leader_ttl)

    def __repr__(self) -> str:
        where = urlsplit(self.dsn)
        return f"<Outbox {where.hostname}:{where.port or 5432}{where.path} schema={self.schema}>"

    async def connect(self) -> Any:
        """A new asyncpg connection to the outbox's database (the ``postgres`` extra)."""
        try:
            import asyncpg
        except ImportError as exc:  # pragma: no cover - depends on installed extras
            raise ConfigError(
                f"the outbox needs the 'postgres' extra: {extra_hint('postgres')}"
            ) from exc
        return await asyncio.wait_for(asyncpg.connect(self.dsn), 10)

    async def write(self, conn: Any, queue: str, jobs: Sequence[Job], run_at: float | None) -> None:
        """Write ``jobs`` of ``queue`` as rows on ``conn``, in its open transaction."""
        await write_rows(conn, self.schema, queue, jobs, run_at)

    async def migrate(self) -> list[int]:
        """Create or bring up to date the outbox's tables; the versions applied."""
        conn = await self.connect()
        try:
            return await migrate(conn, self.schema)
        finally:
            await conn.close()

    def sql(self) -> str:
        """The migrations as one SQL script, for teams that run their own."""
        return migration_sql(self.schema)

    async def status(self) -> OutboxStatus:
        """The rows waiting for the relay and the age of the oldest."""
        conn = await self.connect()
        try:
            row = await conn.fetchrow(statement("status", self.schema))
        except Exception as exc:
            if getattr(exc, "sqlstate", None) == _UNDEFINED_TABLE:
                raise pending_migrations_error(self.schema) from None
            raise
        finally:
            await conn.close()
        return OutboxStatus(pending=row["pending"], oldest_age=row["oldest_age"])


def as_outbox(value: object) -> Outbox | None:
    """``App(outbox=...)``: a URL or an Outbox (None: no outbox); else a ConfigError."""
    if value is None or isinstance(value, Outbox):
        return value
    if isinstance(value, str):
        return Outbox(value)
    raise ConfigError(
        "App outbox must be a postgresql:// URL or an aqw.outbox.Outbox, got "
        f"{type(value).__name__}"
    )
