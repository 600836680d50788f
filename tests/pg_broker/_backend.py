"""What the tests shared by every broker ask of ``tests.conftest.Backend``, on the real
PostgreSQL: brokers and apps on one queue of a fresh schema (dropped at the end), each
broker with a pool of its own (another process's)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

import aqw
from aqw.brokers.postgres import PostgresBroker
from aqw.brokers.postgres._connection import Connection
from tests._helpers import PG_DSNS


class PgBackend:
    kind = "postgresql"
    raw = None
    is_redis = False

    def __init__(self, schema: str) -> None:
        self.queue = "q"
        self.schema = schema
        self.apps: list[aqw.App] = []
        self.brokers: list[PostgresBroker] = []

    def broker(self, queue: str | None = None) -> PostgresBroker:
        broker = PostgresBroker(Connection(PG_DSNS[0], self.schema, 4), queue or self.queue)
        self.brokers.append(broker)
        return broker

    def app(self, queue: str | None = None, **options: Any) -> aqw.App:
        app = aqw.App(self.broker(queue), **options)
        self.apps.append(app)
        return app


@pytest.fixture
async def backend() -> AsyncIterator[PgBackend]:
    b = PgBackend(f"aqw_pgt_{uuid.uuid4().hex[:10]}")
    try:
        yield b
    finally:
        for app in b.apps:
            await app.close()
        for broker in b.brokers:  # an app given a broker does not close it
            await broker.close()
        conn = await asyncpg.connect(PG_DSNS[0])
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{b.schema}" CASCADE')
        finally:
            await conn.close()
