"""``job_start.lua`` per job and per merged call, on fakeredis and the real Redis: the fencing
counter is read once and written once per call, so a call that an error stops midway must
still count every token it handed out; jobs started together get distinct, growing tokens;
the fields of an earlier run leave the record at the next start and stay away otherwise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import redis.exceptions
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


async def fetch_n(broker: RedisBroker, n: int) -> list[aqw.Job]:
    deadline = time.monotonic() + 5.0
    got: list[Delivery] = []
    while len(got) < n:
        got += await broker.fetch(n - len(got), block=0.05)
        assert time.monotonic() < deadline, f"{len(got)} of {n} deliveries"
    return [aqw.Job.decode(d.data) for d in got]


def lease_of(broker: RedisBroker, job: aqw.Job) -> Lease:
    return Lease(broker.job_lease_backend(job), broker.job_lease_key(job), ttl=30.0)


async def test_tokens_taken_before_an_error_are_counted(kit: Kit) -> None:
    b = kit.broker
    await b.publish([aqw.Job(task="work", payload={"n": n}) for n in range(3)])
    first, broken, later = await fetch_n(b, 3)
    await kit.raw.hset(b.keys.lease(broken.id), "not", "a string")  # GET fails on it
    one, two = lease_of(b, first), lease_of(b, broken)
    # started in the same moment: one merged call, which the second job's key stops midway
    got = await asyncio.gather(one.acquire(), two.acquire(), return_exceptions=True)
    assert all(isinstance(g, redis.exceptions.ResponseError) for g in got), got
    assert await kit.raw.get(b.keys.lease(first.id)) is not None  # the first lease was taken
    assert int(await kit.raw.get(b.keys.fence) or 0) >= 1  # and its token counted
    three = lease_of(b, later)
    await three.acquire()
    assert three.fencing_token == 2  # never the token the first lease was handed


async def test_jobs_started_together_get_distinct_growing_tokens(kit: Kit) -> None:
    b = kit.broker
    await kit.raw.set(b.keys.fence, "41")
    await b.publish([aqw.Job(task="work", payload={"n": n}) for n in range(5)])
    leases = [lease_of(b, j) for j in await fetch_n(b, 5)]
    await asyncio.gather(*(lease.acquire() for lease in leases))
    assert sorted(lease.fencing_token for lease in leases) == [42, 43, 44, 45, 46]
    assert await kit.raw.get(b.keys.fence) == b"46"
    for lease in leases:
        fields = await kit.raw.hgetall(b.keys.record(lease.key.rpartition(":")[2]))
        assert fields[b"state"] == b"running"
        assert fields[b"fencing_token"] == str(lease.fencing_token).encode()


async def test_fields_of_an_earlier_run_leave_the_record_at_start(kit: Kit) -> None:
    b = kit.broker
    await b.publish([aqw.Job(task="work", payload={"n": n}) for n in range(2)])
    stale, fresh = await fetch_n(b, 2)
    await kit.raw.hset(b.keys.record(stale.id), mapping={"progress": "0.5", "message": "half"})
    await asyncio.gather(lease_of(b, stale).acquire(), lease_of(b, fresh).acquire())
    for j in (stale, fresh):
        fields = await kit.raw.hgetall(b.keys.record(j.id))
        assert fields[b"state"] == b"running"
        assert not {b"progress", b"message", b"run_at"} & set(fields), fields


@pytest.mark.parametrize("kind", KINDS)
async def test_a_start_after_a_takeover_not_yet_started_takes_nothing(
    kind: str, queue_names: Callable[[], str]
) -> None:
    """A fresh queued record skips the pending-list check at start; a takeover marks the
    record (reclaim.lua), so the earlier consumer's start, after another consumer claimed the
    delivery but before that one started it, is still refused: nothing taken, no token."""
    async with open_backend(kind, queue_names()) as backend:
        a, b = backend.broker(), backend.broker()
        assert isinstance(a, RedisBroker) and isinstance(b, RedisBroker)
        raw = backend.raw
        assert raw is not None
        try:
            for broker, name in ((a, "a"), (b, "b")):
                await broker.connect()
                await broker.start_consuming(name)
            sent = aqw.Job(task="work", payload={"n": 1})
            await a.publish([sent])
            d = await a.fetch(1, block=1.0)
            assert len(d) == 1
            await asyncio.sleep(0.1)
            [again] = await b.reclaim(10, lambda _: 0.05, 0.05)
            assert again.id == d[0].id
            assert await raw.hget(a.keys.record(sent.id), "claimed") == b"b"
            stale = Lease(a.job_lease_backend(sent, None, d[0]), a.job_lease_key(sent), ttl=30)
            with pytest.raises(aqw.errors.StaleStart):
                await stale.acquire()
            assert stale.fencing_token == 0
            assert await raw.get(a.job_lease_key(sent)) is None
            assert await raw.hget(a.keys.record(sent.id), "state") == b"queued"
            # the consumer that claimed it starts it
            mine = Lease(b.job_lease_backend(sent, None, again), b.job_lease_key(sent), ttl=30)
            await mine.acquire()
            assert mine.fencing_token == 1
        finally:
            await a.close()
            await b.close()


async def test_a_job_published_again_gets_a_fresh_record_and_a_new_one_costs_no_del(
    kit: Kit,
) -> None:
    """A fresh record is one HSET (no DEL first); a record already there (the same job
    published again, after a run) is replaced whole, alone or in a batch."""
    b = kit.broker
    lone, pair = aqw.Job(task="work", payload={"n": 1}), aqw.Job(task="work", payload={"n": 2})
    await b.publish([lone])
    await b.publish([pair, aqw.Job(task="work", payload={"n": 3})])
    fresh = await kit.raw.hgetall(b.keys.record(lone.id))
    assert fresh[b"state"] == b"queued" and b"cancel" not in fresh
    for job in (lone, pair):
        rec = b.keys.record(job.id)
        await kit.raw.hset(rec, mapping={"state": "succeeded", "cancel": "1", "result": "9"})
    await b.publish([lone])
    await b.publish([pair, aqw.Job(task="work", payload={"n": 4})])
    for job in (lone, pair):
        fields = await kit.raw.hgetall(b.keys.record(job.id))
        assert fields[b"state"] == b"queued", fields
        assert not {b"cancel", b"result"} & set(fields), fields
        assert await kit.raw.pttl(b.keys.record(job.id)) not in (-1, -2)  # it has an expiry
