"""``ack.lua`` on a merged call, on fakeredis and the real Redis: the call reads its entries'
pending state with one ``XPENDING`` over their range and acknowledges the accepted ones with
one ``XACK``, and still refuses, job by job, what a per-entry ``XACK`` refused: an entry
settled already (in the same call too), and an entry another consumer claimed after this
holder's lease lapsed; the other jobs of the call are settled all the same."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from conftest import open_backend
from redis.asyncio import Redis

import aqw
from aqw.brokers.base import Delivery
from aqw.brokers.redis import RedisBroker
from aqw.lease import Lease

pytestmark = pytest.mark.timeout(60)

KINDS = ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)]


@dataclass
class Kit:
    broker: RedisBroker
    raw: Redis


@pytest.fixture(params=KINDS)
async def kit(request: pytest.FixtureRequest, queue_names: Callable[[], str]) -> AsyncIterator[Kit]:
    async with open_backend(request.param, queue_names()) as backend:
        broker = backend.broker()
        assert isinstance(broker, RedisBroker)
        await broker.connect()
        await broker.start_consuming("c1")
        assert backend.raw is not None
        try:
            yield Kit(broker, backend.raw)
        finally:
            await broker.close()


async def started(b: RedisBroker, n: int) -> list[tuple[Delivery, aqw.Job, Lease]]:
    await b.publish([aqw.Job(task="work", payload={"n": i}) for i in range(n)])
    deadline = time.monotonic() + 5.0
    got: list[Delivery] = []
    while len(got) < n:
        got += await b.fetch(n - len(got), block=0.05)
        assert time.monotonic() < deadline, f"{len(got)} of {n} deliveries"
    out = []
    for d in got:
        job = aqw.Job.decode(d.data)
        lease = Lease(b.job_lease_backend(job), b.job_lease_key(job), ttl=30.0)
        await lease.acquire()
        out.append((d, job, lease))
    return out


async def pending_ids(kit: Kit) -> set[str]:
    rows = await kit.raw.xpending_range(kit.broker.keys.stream, "aqw", "-", "+", 1000)
    return {r["message_id"].decode() for r in rows}


async def test_a_merged_call_settles_its_jobs_and_refuses_a_settled_entry(kit: Kit) -> None:
    b = kit.broker
    jobs = await started(b, 5)
    gone = jobs[2][0]
    await kit.raw.xack(b.keys.stream, "aqw", gone.id)  # settled elsewhere meanwhile
    first = jobs[0]
    calls = [b.ack(d, job, lease) for d, job, lease in jobs]
    calls.append(b.ack(*first))  # the same entry twice in one call: one of them settles it
    got = await asyncio.gather(*calls)
    assert got[2] is False
    assert got[1] and got[3] and got[4]
    assert sorted([got[0], got[5]]) == [False, True]
    assert await pending_ids(kit) == set()
    for i in (0, 1, 3, 4):
        state = await kit.raw.hget(b.keys.record(jobs[i][1].id), "state")
        assert state == b"succeeded"
    assert await kit.raw.hget(b.keys.record(jobs[2][1].id), "state") == b"running"
    assert await kit.raw.xlen(b.keys.stream) == 1  # only the entry settled elsewhere is left


async def test_an_entry_another_consumer_claimed_is_refused_the_rest_settled(kit: Kit) -> None:
    b = kit.broker
    jobs = await started(b, 3)
    taken_d, taken_job, _ = jobs[1]
    # the holder's lease lapsed and consumer c2 took the delivery over (reclaim.lua's marks)
    await kit.raw.delete(b.keys.lease(taken_job.id))
    await kit.raw.xclaim(b.keys.stream, "aqw", "c2", 0, [taken_d.id])
    await kit.raw.hset(b.keys.record(taken_job.id), "claimed", "c2")
    got = await asyncio.gather(*(b.ack(d, job, lease) for d, job, lease in jobs))
    assert got == [True, False, True]
    assert await pending_ids(kit) == {taken_d.id}
    assert await kit.raw.hget(b.keys.record(taken_job.id), "state") == b"running"


async def test_a_live_lease_settles_an_entry_another_consumer_claimed(kit: Kit) -> None:
    # as a per-entry XACK did: the lease key still holds this holder's token, so the settle
    # is this holder's, wherever the entry is pending (it is looked up alone: it is not in
    # this consumer's pending range)
    b = kit.broker
    jobs = await started(b, 3)
    taken_d, taken_job, _ = jobs[0]
    await kit.raw.xclaim(b.keys.stream, "aqw", "c2", 0, [taken_d.id])
    await kit.raw.hset(b.keys.record(taken_job.id), "claimed", "c2")
    got = await asyncio.gather(*(b.ack(d, job, lease) for d, job, lease in jobs))
    assert got == [True, True, True]
    assert await pending_ids(kit) == set()
    assert await kit.raw.xlen(b.keys.stream) == 0
