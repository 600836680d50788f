"""The order in which the PostgreSQL broker's statements lock a job: its record, then its lease,
then its row, in the batched start (``start_many.sql``), the batched ack (``ack_many.sql``)
and the other settles (``_settle.py``). With the ack locking the lease first and the record
last, a resumed ex-holder's ack and the new holder's start of the same job each held what the
other waited for (found by the chaos run: the server broke the cycle by failing a whole
batch of starts). Here the job's record is held by the test: a settle must then wait for it
with the lease and the row still free, whatever the other statements do."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from aqw.brokers.messages import Failure, Finish
from aqw.brokers.postgres import PostgresBroker
from aqw.brokers.postgres._batch import Batcher
from aqw.brokers.postgres._connection import Connection
from aqw.job import Job
from aqw.lease import Lease
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(60)


async def _waiting_on_a_lock(dsn: str, own: set[int]) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        pids = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> ALL($1)",
            list(own),
        )
    finally:
        await conn.close()
    return bool(pids)


@pytest.mark.parametrize("settle", ["ack", "retry", "dead_letter"])
async def test_a_settle_waits_for_the_jobs_record_with_its_lease_and_row_still_free(
    where: tuple[str, str], settle: str
) -> None:
    dsn, schema = where
    worker = PostgresBroker(Connection(dsn, schema, 2), "q")
    worker.consumer = "w"
    blocker = await asyncpg.connect(dsn)
    probe = await asyncpg.connect(dsn)
    try:
        await worker.publish([Job(task="work", payload=b"1")])
        [delivery] = await worker.fetch(1, 5.0)
        job = Job.decode(delivery.data)
        key = worker.job_lease_key(job)
        lease = Lease(worker.job_lease_backend(job, delivery=delivery), key, ttl=30)
        await lease.acquire()

        holding = blocker.transaction()
        await holding.start()
        locked = await blocker.fetchval(
            f'SELECT count(*) FROM (SELECT 1 FROM "{schema}".aqw_records '
            "WHERE job_id = $1 FOR UPDATE) AS r",
            job.id,
        )
        assert locked == 1
        failure = Failure("ValueError", "bad", worker="w", failed_at=time.time())
        settles = {
            "ack": lambda: worker.ack(delivery, job, lease, 0.0, Finish()),
            "retry": lambda: worker.retry(delivery, job, time.time() + 60, lease, failure),
            "dead_letter": lambda: worker.dead_letter(delivery, job, failure, 1, lease),
        }
        running = asyncio.create_task(settles[settle]())
        own = {blocker.get_server_pid(), probe.get_server_pid()}
        await eventually(lambda: _waiting_on_a_lock(dsn, own), 20, "the settle's wait")
        async with probe.transaction():  # neither is locked while the record is awaited
            lease_row = await probe.fetchval(
                f'SELECT key FROM "{schema}".aqw_leases WHERE key = $1 FOR UPDATE NOWAIT', key
            )
            job_row = await probe.fetchval(
                f'SELECT id FROM "{schema}".aqw_jobs WHERE id = $1 FOR UPDATE NOWAIT',
                int(delivery.id),
            )
        assert (lease_row, job_row) == (key, int(delivery.id))
        assert not running.done()
        await holding.rollback()
        assert await asyncio.wait_for(running, 20)
    finally:
        await blocker.close()
        await probe.close()
        await worker.close()


async def test_a_batch_the_server_broke_out_of_a_deadlock_goes_again() -> None:
    calls: list[list[int]] = []

    class Deadlock(Exception):
        sqlstate = "40P01"

    async def run(args: list[int]) -> list[int]:
        calls.append(list(args))
        if len(calls) < 3:
            raise Deadlock("deadlock detected")
        return [a * 2 for a in args]

    batcher: Batcher[int, int] = Batcher(run)  # type: ignore[arg-type]
    assert await asyncio.gather(batcher.submit(1), batcher.submit(2)) == [2, 4]
    assert calls == [[1, 2]] * 3

    async def broken(args: list[int]) -> list[int]:
        raise ValueError("not a deadlock")

    other: Batcher[int, int] = Batcher(broken)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a deadlock"):
        await other.submit(1)
