"""The broker's versioned migrations (``aqw/brokers/postgres/sql/NNNN_*.sql``) on the real
PostgreSQL: the script ``aqw db sql --broker-tables`` prints applies by hand (functions
included) and leaves ``migrate`` nothing to do; a schema at version 3 (before rate limits,
run-time limits, debounce and depth history) is brought up to date, versions 4 to 7."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from aqw.brokers.postgres import _sql
from aqw.brokers.postgres._sql import migrate, migration_sql, migrations
from tests._helpers import PG_DSNS

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def conn() -> AsyncIterator[tuple[asyncpg.Connection, str]]:
    c = await asyncpg.connect(PG_DSNS[0])
    schema = f"aqw_pgm_{uuid.uuid4().hex[:10]}"
    try:
        yield c, schema
    finally:
        await c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await c.close()


async def _versions(c: asyncpg.Connection, schema: str) -> list[int]:
    sql = f'SELECT version FROM "{schema}".aqw_migrations WHERE component = $1 ORDER BY 1'
    return [r["version"] for r in await c.fetch(sql, "broker")]


async def test_the_printed_script_applies_and_migrate_finds_nothing_to_do(
    conn: tuple[asyncpg.Connection, str],
) -> None:
    c, schema = conn
    await c.execute(migration_sql(schema))
    assert await _versions(c, schema) == [v for v, _ in migrations()]
    assert await migrate(c, schema) == []
    functions = await c.fetch(
        "SELECT proname FROM pg_proc WHERE pronamespace = $1::regnamespace ORDER BY 1", schema
    )
    assert [f["proname"] for f in functions] == ["aqw_debounce_publish", "aqw_start_limited"]


async def test_a_schema_at_version_3_is_brought_up_to_date(
    conn: tuple[asyncpg.Connection, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, schema = conn
    every = migrations()
    assert [v for v, _ in every] == [1, 2, 3, 4, 5, 6, 7]
    monkeypatch.setattr(_sql, "migrations", lambda: every[:3])
    assert await migrate(c, schema) == [1, 2, 3]
    monkeypatch.setattr(_sql, "migrations", lambda: every)
    assert await migrate(c, schema) == [4, 5, 6, 7]
    assert await _versions(c, schema) == [1, 2, 3, 4, 5, 6, 7]
