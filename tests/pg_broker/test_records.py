"""Job records on the PostgreSQL broker are shared: a result awaited in one process while a
worker in another runs the job, a cancel from another process (a waiting job never runs; a
running one is stopped), and brokers of separate pools (each another process's) seeing one
record, its end, its cancel and its expiry."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg
import pytest

import aqw
from aqw.brokers.messages import Delivery, Finish
from aqw.brokers.postgres import PostgresBroker
from aqw.brokers.postgres._connection import Connection
from aqw.errors import JobCancelled
from aqw.job import Job
from aqw.lease import Lease
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(90)
HERE = Path(__file__).resolve().parent


def broker(where: tuple[str, str], consumer: str) -> PostgresBroker:
    b = PostgresBroker(Connection(where[0], where[1], 2), "q")
    b.consumer = consumer
    return b


async def take(b: PostgresBroker) -> tuple[Delivery, Job]:
    [d] = await b.fetch(1, 5.0)
    return d, Job.decode(d.data)


async def test_a_result_awaited_in_one_process_from_a_worker_in_another(
    where: tuple[str, str],
) -> None:
    dsn, schema = where
    url = f"{dsn}?schema={schema}&queue=q"
    app = aqw.App(url)  # the producer: the same tasks, run only by the worker process

    @app.task(name="double", keep_result=True)
    async def double(n: int) -> int:
        return n * 2

    @app.task(name="hang")
    async def hang(n: int) -> None:
        await asyncio.Event().wait()

    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "pg_records_proc.py"), url, env={**os.environ}
    )
    try:
        job_id = await double.enqueue(21)
        assert await app.result(job_id, timeout=30) == 42
        info = await app.job(job_id)
        assert info is not None and (info.state, info.attempts) == ("succeeded", 1)

        hung = await hang.enqueue(1)

        async def running() -> bool:
            got = await app.job(hung)
            return got is not None and got.state == "running"

        await eventually(running, 30, "the hang job running in the worker process")
        assert await app.cancel(hung) == "cancelling"
        ended = await app.broker.records.wait_finished(hung, 30)
        assert (ended.state, ended.finished) == ("cancelled", True)
    finally:
        proc.terminate()
        await proc.wait()
        await app.close()


async def test_a_cancel_from_another_broker_refuses_the_start_and_stops_a_running_job(
    where: tuple[str, str],
) -> None:
    producer, other, worker = (broker(where, c) for c in ("p", "o", "w"))
    try:
        waiting, running = Job(task="work", payload=b"1"), Job(task="work", payload=b"2")
        await producer.publish([waiting])
        assert await other.records.cancel(waiting.id) == "cancelled"
        d, got = await take(worker)
        key = worker.job_lease_key(got)
        with pytest.raises(JobCancelled):  # a waiting job cancelled elsewhere never runs
            await worker.job_lease_backend(got, delivery=d).acquire(key, "t1", 5000)
        assert await worker.lease_backend().renew(key, "t1", 5000) is False  # nothing taken
        assert (await producer.records.wait_finished(waiting.id, 5)).state == "cancelled"
        assert await worker.ack(d, got, None, 0.0, Finish("cancelled", 60)) is True

        await producer.publish([running])
        d, got = await take(worker)
        lease = Lease(worker.job_lease_backend(got, delivery=d), worker.job_lease_key(got), ttl=30)
        await lease.acquire()
        assert lease.fencing_token > 0
        assert await worker.records.cancel_requested(running.id) is False
        assert await other.records.cancel(running.id) == "cancelling"
        assert await worker.records.cancel_requested(running.id) is True  # read by the holder
        waiter = asyncio.create_task(other.records.wait_finished(running.id, 30))
        assert await worker.ack(d, got, lease, 0.0, Finish("cancelled", 60)) is True
        assert (await waiter).state == "cancelled"
        assert await other.records.cancel(running.id) == "finished"
    finally:
        for b in (producer, other, worker):
            await b.close()


async def test_finished_records_expire_in_batches(where: tuple[str, str]) -> None:
    producer, worker = broker(where, "p"), broker(where, "w")
    try:
        jobs = [Job(task="work", payload=str(i).encode()) for i in range(10)]
        await producer.publish(jobs)
        short = set()
        for i in range(10):
            d, got = await take(worker)
            keep = 0.01 if i % 2 else 3600.0
            if i % 2:
                short.add(got.id)
            assert await worker.ack(d, got, None, 0.0, Finish(keep_for=keep))
        await asyncio.sleep(0.1)
        kept = [j.id for j in jobs if j.id not in short]
        assert [await producer.records.record(i) for i in short] == [None] * 5
        assert all([await producer.records.record(i) for i in kept])
        conn = await asyncpg.connect(where[0])
        try:
            count = f'SELECT count(*) FROM "{where[1]}".aqw_records'
            assert await conn.fetchval(count) == 10  # past their time, not yet swept
            assert await producer.records.sweep() == 5
            assert await conn.fetchval(count) == 5
            left = await conn.fetch(f'SELECT job_id FROM "{where[1]}".aqw_records')
            assert {r["job_id"] for r in left} == set(kept)
        finally:
            await conn.close()
    finally:
        await producer.close()
        await worker.close()


async def test_ends_acked_in_one_batch_wake_their_waiters_with_one_notification(
    where: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 jobs awaited from a broker of its own pool (another process's listener); a worker
    acks them in batches, each batch notifying the ids of its ends joined by ','. With the
    waiters' periodic re-read pushed past the test's bound, only the notifications can wake
    them: every waiter sees its job succeeded, and some notification carried several ids."""
    from aqw.brokers.postgres import _records

    monkeypatch.setattr(_records, "REREAD_EVERY", 600.0)
    payloads: list[str] = []
    heard = _records.PgJobRecords._heard

    def spy(self: _records.PgJobRecords, payload: str) -> None:
        payloads.append(payload)
        heard(self, payload)

    monkeypatch.setattr(_records.PgJobRecords, "_heard", spy)
    dsn, schema = where
    app = aqw.App(f"{dsn}?schema={schema}&queue=q")

    @app.task(name="noop")
    async def noop(n: int) -> None: ...

    ids = await noop.enqueue_many(list(range(60)))
    waiter = broker(where, "waiter")
    await waiter.connect()
    try:
        waits = [asyncio.create_task(waiter.records.wait_finished(i, 60)) for i in ids]
        await eventually(lambda: waiter.records.waiting() == 60, 30, "all waiting")  # type: ignore[attr-defined]
        async with app.worker(concurrency=60):
            infos = await asyncio.wait_for(asyncio.gather(*waits), 60)
    finally:
        await waiter.close()
    assert [info.state for info in infos] == ["succeeded"] * 60
    woken = [i for p in payloads for i in p.split(",")]
    assert set(ids) <= set(woken)
    assert max(len(p.split(",")) for p in payloads) > 1
    await app.close()
