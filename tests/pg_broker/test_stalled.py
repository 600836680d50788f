"""A pool session stopped halfway through a statement's messages: the state a worker frozen
between a statement's parse and its execution leaves on the server (found by the chaos run:
a holder SIGSTOPped mid-settle kept its job's row locked for minutes, and every worker's
reclaim of it waited). The server counts such a session active, so its idle-in-transaction
bound never ends it; ``Connection.end_stalled`` (run by every worker's promote loop) does.

The stalled session is made with libpq's pipeline mode (psycopg): a statement sent without
the Sync that would end it, its row lock held while the server waits for the rest."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import psycopg
import pytest

from aqw.brokers.postgres import _connection
from aqw.brokers.postgres._connection import APPLICATION_NAME, Connection
from tests._helpers import PG_DSNS

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def table() -> AsyncIterator[str]:
    name = f"aqw_stall_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_DSNS[0])
    try:
        await conn.execute(
            f"CREATE TABLE {name} (id int PRIMARY KEY); INSERT INTO {name} VALUES (1), (2)"
        )
        yield name
        await conn.execute(f"DROP TABLE IF EXISTS {name}")
    finally:
        await conn.close()


def _stall(table: str, application_name: str, row: int) -> Iterator[psycopg.Connection]:
    """A session of ``application_name`` that locked ``row`` of ``table`` and stopped before
    its statement's Sync."""
    conn = psycopg.connect(PG_DSNS[0], application_name=application_name, autocommit=True)
    try:
        conn.pgconn.enter_pipeline_mode()
        conn.pgconn.send_query_params(
            f"SELECT id FROM {table} WHERE id = {row} FOR UPDATE".encode(), None
        )
        conn.pgconn.send_flush_request()
        conn.pgconn.flush()
        yield conn
    finally:
        conn.pgconn.finish()


async def _locked(table: str, row: int) -> bool:
    conn = await asyncpg.connect(PG_DSNS[0])
    try:
        await conn.execute("SET lock_timeout = '200ms'")
        try:
            await conn.execute(f"SELECT id FROM {table} WHERE id = {row} FOR UPDATE")
        except asyncpg.LockNotAvailableError:
            return True
        return False
    finally:
        await conn.close()


async def test_a_session_stalled_mid_statement_is_ended_and_its_lock_freed(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A name of this test's own: the check ends no session of a test running beside it.
    name = f"aqw-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(_connection, "APPLICATION_NAME", name)
    monkeypatch.setattr(_connection, "STALLED_AFTER", 3600.0)
    monkeypatch.setattr(_connection, "STALLED_CHECK_EVERY", 0.0)
    schema = f"aqw_stall_{uuid.uuid4().hex[:8]}"
    checker = Connection(PG_DSNS[0], schema, 2)
    await checker.open()
    others = _stall(table, "the-application", 2)  # not aqw's: never ended
    other = next(others)
    try:
        stalled = _stall(table, name, 1)
        next(stalled)
        try:
            assert await _locked(table, 1)
            assert await checker.end_stalled() == 0  # not stalled long enough yet
            monkeypatch.setattr(_connection, "STALLED_AFTER", 0.0)
            assert await checker.end_stalled() == 1
            assert not await _locked(table, 1)  # freed with its session
            assert await _locked(table, 2)  # the application's own session: left alone
            assert other.pgconn.status == psycopg.pq.ConnStatus.OK
        finally:
            stalled.close()
    finally:
        others.close()
        await checker.pool.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await checker.close()
    assert not await _locked(table, 2)


async def test_the_pool_names_its_sessions_unless_the_url_does() -> None:
    mine = Connection(PG_DSNS[0], "s", 2)
    assert mine._settings()["application_name"] == APPLICATION_NAME
    theirs = Connection(PG_DSNS[0] + "?application_name=billing", "s", 2)
    assert "application_name" not in theirs._settings()
