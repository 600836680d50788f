"""The PostgreSQL broker's listening connection, shared by every waiter of a process: LISTENs
asked for at once (a fetch's wake-up, several ``app.result`` waits) all take, and a listener
cut by the server is reopened once however many fetches notice it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from aqw.brokers.postgres._connection import Connection
from tests._helpers import PG_DSNS, eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def connection() -> AsyncIterator[Connection]:
    dsn, schema = PG_DSNS[0], f"aqw_pgl_{uuid.uuid4().hex[:10]}"
    conn = Connection(dsn, schema, 2)
    await conn.open()
    try:
        yield conn
    finally:
        await conn.close()
        admin = await asyncpg.connect(dsn)
        try:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await admin.close()


async def _notify_all(channels: list[str]) -> None:
    sender = await asyncpg.connect(PG_DSNS[0])
    try:
        for channel in channels:
            await sender.execute("SELECT pg_notify($1, 'x')", channel)
    finally:
        await sender.close()


async def test_listens_asked_for_at_once_all_take(connection: Connection) -> None:
    channels = [f"aqw_t_{i}" for i in range(20)]
    heard: list[str] = []
    events = await asyncio.gather(
        *(connection.listen(c) for c in channels[:10]),
        *(connection.listen(c) for c in channels[:10]),  # the same channels again, at once
    )
    await asyncio.gather(
        *(connection.subscribe(c, lambda payload, c=c: heard.append(c)) for c in channels[10:])
    )
    await _notify_all(channels)
    for event in events:
        await asyncio.wait_for(event.wait(), 10)
    await eventually(lambda: len(heard) == 10, 10, "every subscriber's notification")
    assert sorted(heard) == sorted(channels[10:])


async def test_a_cut_listener_is_reopened_once_for_many_fetches(connection: Connection) -> None:
    event = await connection.listen("aqw_t_cut")
    old = connection._listener
    admin = await asyncpg.connect(PG_DSNS[0])
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", old.get_server_pid())
    finally:
        await admin.close()
    await eventually(old.is_closed, 10, "the listener cut")
    assert await asyncio.gather(*(connection.relisten() for _ in range(5))) == [True] * 5
    assert connection._listener is not old
    await _notify_all(["aqw_t_cut"])
    await asyncio.wait_for(event.wait(), 10)
