"""Crash recovery by each job's own lease TTL, and settles that cannot double-run a job.

Two brokers on one queue act as consumers ``a`` and ``b``: ``a`` fetches and stops (or
pauses), ``b`` reclaims. ``Broker.reclaim(count, lease_ttl, min_idle)`` takes an entry once
it has been idle for its own job's lease TTL and its job's lease key does not exist; a settle
by ``a`` after ``b`` claimed the entry is refused even though ``a``'s lease simply expired.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import Backend

from aqw._redis import scripts as _scripts
from aqw._redis.keys import GROUP
from aqw.brokers.base import Broker, Delivery, Failure
from aqw.brokers.redis import RedisBroker
from aqw.job import Job
from aqw.lease import Lease
from tests._helpers import publish_raw

pytestmark = pytest.mark.timeout(30)

SHORT = 0.2  # seconds: the lease TTL of task "short" and of undecodable entries
LONG = 60.0  # every other task


class TTLs:
    """A ``lease_ttl`` callback that records what it was asked about."""

    def __init__(self, short: float = SHORT, none: float = SHORT) -> None:
        self.short, self.none = short, none
        self.asked: list[Job | None] = []

    def __call__(self, job: Job | None) -> float:
        self.asked.append(job)
        if job is None:
            return self.none
        return self.short if job.task == "short" else LONG

    @property
    def min_idle(self) -> float:
        return min(self.short, self.none)


Pair = tuple[Broker, Broker]


@pytest.fixture
async def pair(backend: Backend) -> AsyncIterator[Pair]:
    """Consumers ``a`` and ``b`` on the test's queue."""
    a, b = backend.broker(), backend.broker()
    for broker, name in ((a, "a"), (b, "b")):
        await broker.connect()
        await broker.start_consuming(name)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def fetch_one(broker: Broker) -> Delivery:
    [delivery] = await broker.fetch(1, 0.5)
    return delivery


def job_of(delivery: Delivery) -> Job | None:
    try:
        return Job.decode(delivery.data)
    except Exception:
        return None


async def reclaim_when_due(
    broker: Broker, ttls: TTLs, within: float, count: int = 10
) -> list[Delivery]:
    deadline = time.monotonic() + within
    while True:
        got = await broker.reclaim(count, ttls, ttls.min_idle)
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.02)


# -- reclaim by the job's own lease TTL --------------------------------------------------------


async def test_an_abandoned_entry_is_reclaimed_after_its_own_lease_ttl(pair: Pair) -> None:
    a, b = pair
    ttls = TTLs()
    await a.publish([Job(task="short", payload={"n": 1})])
    await a.publish([Job(task="long")])
    taken = time.monotonic()  # before the delivery: its idle time counts from later
    short = await fetch_one(a)
    long = await fetch_one(a)  # ...and consumer a stops, settling neither

    assert await b.reclaim(10, ttls, ttls.min_idle) == []  # not idle for its TTL yet
    got = await reclaim_when_due(b, ttls, within=3.0)
    waited = time.monotonic() - taken

    assert [(d.id, d.data, d.delivery_count) for d in got] == [(short.id, short.data, 2)]
    assert SHORT <= waited < LONG, waited  # its own 0.2 s, not the 60 s of "long"
    long_job = job_of(long)
    assert long_job is not None
    # Looked at once idle for the shortest TTL, and left for its own (under load it may have
    # been delivered too late to be idle enough at the first reclaim: ask again after SHORT).
    if long_job not in ttls.asked:
        await asyncio.sleep(SHORT)
        assert await b.reclaim(10, ttls, ttls.min_idle) == []
    assert long_job in ttls.asked
    assert await b.reclaim(10, ttls, ttls.min_idle) == []  # b holds short now: not idle
    assert not await a.keep_alive(short)  # no longer a's
    assert (await a.depth()).in_flight == 2


async def test_each_reclaim_counts_one_more_delivery(pair: Pair) -> None:
    a, b = pair
    ttls = TTLs()
    await a.publish([Job(task="short")])
    first = await fetch_one(a)
    assert first.delivery_count == 1
    [by_b] = await reclaim_when_due(b, ttls, within=3.0)
    [by_a] = await reclaim_when_due(a, ttls, within=3.0)  # b stopped too; a is back
    assert (by_b.id, by_b.delivery_count) == (first.id, 2)
    assert (by_a.id, by_a.delivery_count) == (first.id, 3)


async def test_entries_idle_less_than_min_idle_are_not_even_looked_at(pair: Pair) -> None:
    a, b = pair
    ttls = TTLs()
    await a.publish([Job(task="short"), Job(task="long")])
    await a.fetch(2, 0.5)
    assert await b.reclaim(10, ttls, min_idle=30.0) == []
    assert ttls.asked == []  # neither entry was even decoded
    await asyncio.sleep(SHORT + 0.05)
    assert await b.reclaim(10, ttls, min_idle=30.0) == []
    assert ttls.asked == []
    assert len(await b.reclaim(10, ttls, ttls.min_idle)) == 1  # the short one, now


async def test_an_entry_whose_lease_is_held_is_never_reclaimed(pair: Pair) -> None:
    a, b = pair
    ttls = TTLs()
    job = Job(task="short")
    await a.publish([job])
    delivery = await fetch_one(a)
    key = a.job_lease_key(job)
    assert await a.lease_backend().acquire(key, "a-token", 60_000) is not None

    for _ in range(3):  # idle for 3x its TTL and more: a's lease is still held
        await asyncio.sleep(SHORT)
        assert await b.reclaim(10, ttls, ttls.min_idle) == []
    assert await a.keep_alive(delivery)  # still a's

    # the control: once the lease is gone the same entry is taken
    assert await a.lease_backend().release(key, "a-token")
    got = await reclaim_when_due(b, ttls, within=3.0)
    assert [(d.id, d.delivery_count) for d in got] == [(delivery.id, 2)]


async def test_a_live_holder_that_keeps_its_delivery_alive_keeps_it(pair: Pair) -> None:
    a, b = pair
    ttls = TTLs()
    await a.publish([Job(task="short")])
    delivery = await fetch_one(a)
    for _ in range(6):  # 3x its TTL, refreshed twice per TTL (no lease at all)
        await asyncio.sleep(SHORT / 2)
        assert await a.keep_alive(delivery)
        assert await b.reclaim(10, ttls, ttls.min_idle) == []
    got = await reclaim_when_due(b, ttls, within=3.0)  # a stops refreshing
    assert [d.id for d in got] == [delivery.id]
    assert not await a.keep_alive(delivery)


async def test_a_malformed_entry_is_reclaimed_after_the_ttl_for_none(
    backend: Backend, pair: Pair
) -> None:
    a, b = pair
    ttls = TTLs(short=LONG, none=SHORT)  # undecodable: 0.2 s; every task: 60 s
    await publish_raw(backend, a, {"j": b"{not json"})
    await a.publish([Job(task="short")])
    bad = await fetch_one(a)
    good = await fetch_one(a)
    assert job_of(bad) is None and job_of(good) is not None

    got = await reclaim_when_due(b, ttls, within=3.0)
    assert [(d.id, d.data, d.delivery_count) for d in got] == [(bad.id, b"{not json", 2)]
    assert None in ttls.asked
    again = await reclaim_when_due(b, ttls, within=3.0)  # b did not keep it alive either
    assert [(d.id, d.delivery_count) for d in again] == [(bad.id, 3)]  # the good one waits 60 s


async def test_an_entry_without_a_job_field_is_reclaimed_whole(redis_backend: Backend) -> None:
    a, b = redis_backend.broker(), redis_backend.broker()
    try:
        for broker, name in ((a, "a"), (b, "b")):
            await broker.connect()
            await broker.start_consuming(name)
        ttls = TTLs(short=LONG, none=SHORT)
        await publish_raw(redis_backend, a, {"x": b"1"})
        [taken] = await a.fetch(1, 0.5)
        got = await reclaim_when_due(b, ttls, within=3.0)
        assert [(d.id, d.data, d.delivery_count) for d in got] == [(taken.id, taken.data, 2)]
        assert taken.data == repr({"x": b"1"}).encode()
    finally:
        await a.close()
        await b.close()


async def test_due_entries_behind_many_waiting_ones_are_found(pair: Pair) -> None:
    a, b = pair
    ttls = TTLs()
    await a.publish([Job(task="long") for _ in range(40)])
    await a.publish([Job(task="short")])
    taken = await a.fetch(41, 0.5)
    assert len(taken) == 41
    await asyncio.sleep(SHORT + 0.05)
    got: list[Delivery] = []
    for _ in range(5):  # the scan is bounded (count 1: 16 entries), but moves on
        got = await b.reclaim(1, ttls, ttls.min_idle)
        if got:
            break
    assert [d.id for d in got] == [taken[-1].id]


async def test_reclaim_takes_at_most_count(pair: Pair) -> None:
    a, b = pair
    ttls = TTLs()
    await a.publish([Job(task="short") for _ in range(5)])
    taken = await a.fetch(5, 0.5)
    await asyncio.sleep(SHORT + 0.05)
    first = await b.reclaim(2, ttls, ttls.min_idle)
    rest = await b.reclaim(10, ttls, ttls.min_idle)
    assert len(first) == 2 and len(rest) == 3
    assert sorted(d.id for d in first + rest) == sorted(d.id for d in taken)


# -- settles after another consumer claimed the entry ------------------------------------------


async def settle(broker: Broker, step: str, delivery: Delivery, lease: Lease | None) -> bool:
    job = job_of(delivery)
    if step == "ack":
        return await broker.ack(delivery, job, lease)
    if step == "retry":
        assert job is not None
        return await broker.retry(delivery, job.next_attempt(), time.time() + 60, lease)
    failure = Failure("ValueError", "ValueError: no", worker="w", failed_at=time.time())
    return await broker.dead_letter(delivery, job, failure, 1, lease) is not None


async def take_lease(broker: Broker, job: Job, ttl: float) -> Lease:
    """A lease on ``job`` acquired straight from the backend (nothing renews it)."""
    lease = Lease(broker.lease_backend(), broker.job_lease_key(job), ttl=ttl)
    assert await broker.lease_backend().acquire(lease.key, lease.token, int(ttl * 1000))
    return lease


async def outcome(broker: Broker) -> dict[str, Any]:
    d = await broker.depth()
    stats = await broker.stats()
    return {
        "in_flight": d.in_flight,
        "delayed": d.delayed,
        "dead": d.dead,
        "settled": sum(stats.get(k, 0) for k in ("processed", "retried", "dead")),
    }


SETTLED = {
    "ack": {"in_flight": 0, "delayed": 0, "dead": 0, "settled": 1},
    "retry": {"in_flight": 0, "delayed": 1, "dead": 0, "settled": 1},
    "dead_letter": {"in_flight": 0, "delayed": 0, "dead": 1, "settled": 1},
}
UNSETTLED = {"in_flight": 1, "delayed": 0, "dead": 0, "settled": 0}


@pytest.mark.parametrize("a_lease", ["expired", "none"])
@pytest.mark.parametrize("step", ["ack", "retry", "dead_letter"])
async def test_a_settle_by_the_old_holder_after_another_claimed_is_refused(
    pair: Pair, step: str, a_lease: str
) -> None:
    a, b = pair
    ttls = TTLs()
    job = Job(task="short")
    await a.publish([job])
    delivery = await fetch_one(a)
    lease = await take_lease(a, job, SHORT) if a_lease == "expired" else None

    # a pauses past its lease; b claims the entry (and has not taken the lease yet)
    [claimed] = await reclaim_when_due(b, ttls, within=3.0)  # only once a's lease expired
    assert claimed.id == delivery.id

    assert not await settle(a, step, delivery, lease)
    assert await outcome(a) == UNSETTLED  # nothing moved: b's run owns the job

    b_lease = await take_lease(b, job, 5.0)
    assert not await settle(a, step, delivery, lease)  # b's lease: refused too
    assert await settle(b, step, claimed, b_lease)
    assert await outcome(a) == SETTLED[step]
    assert not await settle(a, step, delivery, lease)  # and after b settled


@pytest.mark.parametrize("step", ["ack", "retry", "dead_letter"])
async def test_a_claimer_without_a_lease_settles_its_own_claim(pair: Pair, step: str) -> None:
    a, b = pair
    ttls = TTLs()
    await a.publish([Job(task="short")])
    delivery = await fetch_one(a)
    [claimed] = await reclaim_when_due(b, ttls, within=3.0)
    assert not await settle(a, step, delivery, None)
    assert await settle(b, step, claimed, None)
    assert await outcome(b) == SETTLED[step]


@pytest.mark.parametrize("step", ["ack", "retry", "dead_letter"])
async def test_a_settle_with_an_expired_lease_is_accepted_while_the_entry_is_still_ours(
    pair: Pair, step: str
) -> None:
    a, _ = pair
    job = Job(task="short")
    await a.publish([job])
    delivery = await fetch_one(a)
    lease = await take_lease(a, job, 0.05)
    await asyncio.sleep(0.1)  # expired, and nobody claimed the entry
    assert await settle(a, step, delivery, lease)
    assert await outcome(a) == SETTLED[step]


# -- the claim script itself (Redis) -----------------------------------------------------------


async def test_the_reclaim_script_checks_the_lease_and_idle_time_atomically(
    redis_backend: Backend,
) -> None:
    broker = redis_backend.broker()
    raw = redis_backend.raw
    assert isinstance(broker, RedisBroker) and raw is not None
    try:
        await broker.connect()
        await broker.start_consuming("a")
        jobs = [Job(task="short") for _ in range(3)]
        await broker.publish(jobs)
        taken = await broker.fetch(3, 0.5)
        await asyncio.sleep(0.15)
        k = broker.keys
        await raw.set(broker.job_lease_key(jobs[0]), "held", px=60_000)
        script = _scripts.load("reclaim")
        keys = [k.stream, *(broker.job_lease_key(j) for j in jobs), *(k.record(j.id) for j in jobs)]
        argv: list[Any] = [
            GROUP,
            "b",
            taken[0].id,
            100,
            1,  # idle enough, but its lease is held
            taken[1].id,
            60_000,
            1,  # lease free, not idle for 60 s
            taken[2].id,
            100,
            1,
        ]
        reply = await script(raw, keys, argv)
        assert [(e.decode(), int(n)) for e, n in reply] == [(taken[2].id, 2)]
        pending = await raw.xpending_range(k.stream, GROUP, "-", "+", 10)
        owners = {p["message_id"].decode(): p["consumer"].decode() for p in pending}
        assert owners == {taken[0].id: "a", taken[1].id: "a", taken[2].id: "b"}
        # the claimed job's record says who claimed it (job_start.lua then checks the
        # pending list for its earlier consumer); the others are left as they were
        claims = [await raw.hget(k.record(j.id), "claimed") for j in jobs]
        assert claims == [None, None, b"b"]
    finally:
        await broker.close()


async def test_an_entry_deleted_while_pending_is_dropped_not_returned(
    redis_backend: Backend,
) -> None:
    a, b = redis_backend.broker(), redis_backend.broker()
    raw = redis_backend.raw
    assert isinstance(a, RedisBroker) and raw is not None
    try:
        for broker, name in ((a, "a"), (b, "b")):
            await broker.connect()
            await broker.start_consuming(name)
        await a.publish([Job(task="short"), Job(task="short")])
        gone, kept = await a.fetch(2, 0.5)
        await raw.xdel(a.keys.stream, gone.id)
        got = await reclaim_when_due(b, TTLs(), within=3.0)
        assert [d.id for d in got] == [kept.id]
        pending = await raw.xpending_range(a.keys.stream, GROUP, "-", "+", 10)
        assert [p["message_id"].decode() for p in pending] == [kept.id]
    finally:
        await a.close()
        await b.close()
