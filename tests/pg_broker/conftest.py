"""Fixtures of the PostgreSQL broker's tests that restart or kill the server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from tests._helpers import PG_DSNS
from tests.pg_broker.throwaway import ThrowawayPostgres


@pytest.fixture
def server() -> Iterator[ThrowawayPostgres]:
    """A throwaway PostgreSQL cluster of the test's own, on a free port, destroyed after."""
    pg = ThrowawayPostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
async def where() -> AsyncIterator[tuple[str, str]]:
    """(dsn, schema) of a fresh schema on the shared PostgreSQL, dropped at the end."""
    dsn, schema = PG_DSNS[0], f"aqw_pgt_{uuid.uuid4().hex[:10]}"
    yield dsn, schema
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
