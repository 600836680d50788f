"""``ctx.transaction()`` on the PostgreSQL broker: the handler's writes and the job's ack
commit together (one transaction), or not at all: a handler that raises in the block, and a
stale holder whose lease another worker took, leave neither the write nor the ack."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

import aqw
from aqw.brokers.messages import Delivery
from aqw.brokers.postgres import PostgresBroker
from aqw.brokers.postgres._connection import Connection
from aqw.errors import LeaseLost
from aqw.job import Job
from aqw.lease import Lease
from tests._helpers import PG_DSNS, eventually

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def where() -> AsyncIterator[tuple[str, str]]:
    """(dsn, schema) of a fresh schema with a table ``orders`` of the handler's writes."""
    dsn, schema = PG_DSNS[0], f"aqw_pgt_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'CREATE TABLE "{schema}".orders (n int PRIMARY KEY, fence bigint)')
        yield dsn, schema
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def rows(where: tuple[str, str], table: str) -> int:
    conn = await asyncpg.connect(where[0])
    try:
        return int(await conn.fetchval(f'SELECT count(*) FROM "{where[1]}".{table}'))
    finally:
        await conn.close()


def broker(where: tuple[str, str], consumer: str) -> PostgresBroker:
    b = PostgresBroker(Connection(where[0], where[1], 2), "q")
    b.consumer = consumer
    return b


async def started(b: PostgresBroker) -> tuple[Delivery, Job, Lease]:
    [d] = await b.fetch(1, 5.0)
    job = Job.decode(d.data)
    lease = Lease(b.job_lease_backend(job, delivery=d), b.job_lease_key(job), ttl=30)
    await lease.acquire()
    return d, job, lease


async def test_a_handlers_writes_and_its_ack_commit_together(where: tuple[str, str]) -> None:
    dsn, schema = where
    app = aqw.App(f"{dsn}?schema={schema}&queue=q")

    @app.task(name="order")
    async def order(n: int, ctx: aqw.Context) -> None:
        async with ctx.transaction() as conn:
            sql = f'INSERT INTO "{schema}".orders VALUES ($1, $2)'
            await conn.execute(sql, n, ctx.lease.fencing_token if ctx.lease else 0)
        info = await app.job(ctx.job.id)  # the block's commit acked it, before the return
        ended.append(info.state if info else "none")

    ended: list[str] = []
    ids = [await order.enqueue(n) for n in range(5)]
    async with app.worker(concurrency=4) as worker:
        await eventually(lambda: worker.stats.processed == 5, 30, "all acked")
        await eventually(lambda: worker.in_flight == 0, 10, "settled")
        assert worker.stats.lease_lost == 0  # the ack after the handler found it done
    assert await rows(where, "orders") == 5
    assert ended == ["succeeded"] * 5
    for job_id in ids:
        info = await app.job(job_id)
        assert info is not None and (info.state, info.attempts) == ("succeeded", 1)
    depth = await app.broker.depth()
    assert (depth.waiting, depth.in_flight) == (0, 0)
    assert (await app.broker.stats())["processed"] == 5  # counted once each
    await app.close()


async def test_a_raise_in_the_block_rolls_back_the_write_and_the_ack(
    where: tuple[str, str],
) -> None:
    b = broker(where, "w")
    try:
        await b.publish([Job(task="order", payload=b"1")])
        d, job, lease = await started(b)
        with pytest.raises(ValueError):
            async with b.settle_in_transaction(d, job, lease, 0.0, 60) as conn:
                await conn.execute(f'INSERT INTO "{where[1]}".orders VALUES (1, 0)')
                raise ValueError("the handler failed")
        assert await rows(where, "orders") == 0
        assert await rows(where, "aqw_jobs") == 1  # not acked: still held
        info = await b.records.record(job.id)
        assert info is not None and info.state == "running"
        # The job is still this holder's: its plain ack goes through.
        assert await b.ack(d, job, lease) is True
        assert await rows(where, "aqw_jobs") == 0
    finally:
        await b.close()


async def test_a_stale_holders_transaction_rolls_back(where: tuple[str, str]) -> None:
    a, other = broker(where, "a"), broker(where, "b")
    try:
        await a.publish([Job(task="order", payload=b"1")])
        d, job, lease = await started(a)
        key = a.job_lease_key(job)
        conn = await asyncpg.connect(where[0])
        try:  # a's lease lapses (a paused holder) and another worker takes the job over
            await conn.execute(f'DELETE FROM "{where[1]}".aqw_leases WHERE key = $1', key)
        finally:
            await conn.close()
        fence = await other.lease_backend().acquire(key, "token-b", 30_000)
        assert fence is not None and fence > lease.fencing_token
        with pytest.raises(LeaseLost):
            async with a.settle_in_transaction(d, job, lease, 0.0, 60) as tx:
                await tx.execute(
                    f'INSERT INTO "{where[1]}".orders VALUES (1, $1)', lease.fencing_token
                )
        assert await rows(where, "orders") == 0  # the stale holder's write rolled back
        assert await rows(where, "aqw_jobs") == 1  # and the job was not acked
        assert (await a.records.record(job.id)).state == "running"  # type: ignore[union-attr]
        assert await a.ack(d, job, lease) is False  # nor does its plain ack go through
    finally:
        await a.close()
        await other.close()


async def test_a_raise_after_the_block_committed_leaves_the_job_succeeded(
    where: tuple[str, str],
) -> None:
    dsn, schema = where
    app = aqw.App(f"{dsn}?schema={schema}&queue=q", retry=aqw.RetryPolicy(max_retries=2))
    runs: list[int] = []

    @app.task(name="late")
    async def late(n: int, ctx: aqw.Context) -> None:
        runs.append(n)
        async with ctx.transaction() as conn:
            await conn.execute(f'INSERT INTO "{schema}".orders VALUES ($1, 0)', n)
        raise ValueError("after the commit")

    job_id = await late.enqueue(7)
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: runs == [7] and worker.in_flight == 0, 30, "settled")
    info = await app.job(job_id)
    assert info is not None and (info.state, info.attempts) == ("succeeded", 1)
    assert runs == [7] and await rows(where, "orders") == 1
    assert await rows(where, "aqw_jobs") == 0 and await app.dlq.list() == []
    await app.close()


async def test_a_connection_lent_to_a_handler_is_reset_and_the_brokers_own_are_not(
    where: tuple[str, str],
) -> None:
    """The pool has one connection, so the handler's and the broker's are the same one.
    What a handler's ``ctx.transaction()`` leaves in the session (a SET, a LISTEN) is reset
    when it comes back; a connection only the broker's statements used goes back without
    the reset's round trip (its session state stays: the broker's statements leave none)."""
    dsn, schema = where
    app = aqw.App(f"{dsn}?schema={schema}&queue=q&pool=1")

    @app.task(name="order")
    async def order(n: int, ctx: aqw.Context) -> None:
        async with ctx.transaction() as conn:
            await conn.execute("SET statement_timeout = 12345")  # session-wide, not LOCAL
            await conn.execute("LISTEN aqw_test_lent")

    await order.enqueue(1)
    async with app.worker(concurrency=1) as worker:
        await eventually(lambda: worker.stats.processed == 1, 30, "acked")
    pool = app.broker.pool  # type: ignore[attr-defined]
    async with pool.acquire() as c:
        assert await c.fetchval("SHOW statement_timeout") == "0"
        assert await c.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0
        await c.execute("SET statement_timeout = 54321")  # the broker's own: not reset
    async with pool.acquire() as c:
        timeout = await c.fetchval("SHOW statement_timeout")
        await c.execute("RESET statement_timeout")
    assert timeout == "54321ms"
    await app.close()


async def test_a_frozen_broker_transaction_is_ended_by_the_server_and_frees_its_locks(
    where: tuple[str, str],
) -> None:
    """Found by the chaos run (``test_chaos.py``): a worker SIGSTOPped inside a settle's
    transaction kept the job's row, its lease and a shared counter row locked, and every
    other worker's acks waited behind it for as long as it was paused. The server now ends
    a broker transaction idle for 5 s; the handler's part of ``ctx.transaction()`` is
    exempt (it may wait on anything)."""
    b = broker(where, "c1")
    await b.connect()
    pool = b.pool
    frozen = await pool.acquire()
    try:
        assert await frozen.fetchval("SHOW idle_in_transaction_session_timeout") == "5s"
        tx = frozen.transaction()
        await tx.start()
        await frozen.execute("SELECT pg_advisory_xact_lock(42)")  # as a row lock would
        # Another worker waits for the lock: the server frees it within the bound.
        async with pool.acquire() as other:
            await asyncio.wait_for(other.execute("SELECT pg_advisory_xact_lock(42)"), 60)
        # ended: cut (asyncpg says so as a server error, an interface error, or, when the
        # termination notice lands mid-operation, an internal client error)
        cut = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)
        with pytest.raises(cut):
            await frozen.execute("SELECT 1")
    finally:
        await pool.release(frozen)
        await b.close()
