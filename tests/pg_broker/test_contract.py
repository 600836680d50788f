"""The broker contract (``aqw.testing.contract``) on the PostgreSQL broker, against the real
PostgreSQL (``AQW_TEST_PG_DSN``, by default database ``test`` on 127.0.0.1:5432): each test
on a fresh schema (dropped at its end); every ``new_broker`` is another process's broker
(a connection pool of its own)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from aqw.brokers.base import Broker
from aqw.brokers.postgres import PostgresBroker
from aqw.brokers.postgres._connection import Connection
from aqw.testing.contract import (
    DebounceContract,
    HistoryContract,
    LimitsContract,
    MarksContract,
    RecordsContract,
    StatusContract,
    Subject,
    Traits,
    TransportContract,
)
from tests._helpers import PG_DSNS

pytestmark = pytest.mark.timeout(60)

PG = Traits(transient=(asyncpg.PostgresConnectionError, asyncpg.InterfaceError))


@pytest.fixture
async def subject() -> AsyncIterator[Subject]:
    dsn = PG_DSNS[0]
    schema = f"aqw_pgb_{uuid.uuid4().hex[:10]}"
    queue = f"q-{uuid.uuid4().hex[:8]}"

    def new(**_: Any) -> Broker:
        return PostgresBroker(Connection(dsn, schema, 4), queue)

    try:
        yield Subject(new, queue, PG)
    finally:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


class TestPostgresTransport(TransportContract):
    pass


class TestPostgresRecords(RecordsContract):
    pass


class TestPostgresStatus(StatusContract):
    pass


class TestPostgresMarks(MarksContract):
    pass


class TestPostgresLimits(LimitsContract):
    pass


class TestPostgresDebounce(DebounceContract):
    pass


class TestPostgresHistory(HistoryContract):
    pass
