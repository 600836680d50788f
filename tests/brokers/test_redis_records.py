"""Job records on the Redis broker (``aqw:{q}:job:<id>``, aqw/record.py), driven step by step:
publish, fetch, the job's lease (``job_start.lua``), progress, ack / retry / dead-letter /
requeue / replay, cancel in every state, expiry, refusals that must leave the record alone,
and ``wait_finished`` (many waiters on one blocked connection). Each test runs on fakeredis
and on the real Redis; every step is checked against the stored hash itself."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.exceptions
from conftest import open_backend
from redis.asyncio import Redis

import aqw
from aqw.brokers.base import Delivery, Failure, Finish
from aqw.brokers.redis import RedisBroker
from aqw.errors import FenceCorrupted, JobCancelled, UnknownJob
from aqw.lease import Lease
from aqw.record import UNFINISHED_KEEP
from tests._helpers import eventually, ttl_agrees

pytestmark = pytest.mark.timeout(60)

KINDS = ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)]


@dataclass
class Kit:
    """A connected broker (consumer ``c1``) on a fresh queue, a raw client on the same data
    and a factory of more brokers on that queue."""

    broker: RedisBroker
    raw: Redis
    new_broker: Callable[[], RedisBroker]

    async def fields(self, job_id: str) -> dict[str, str]:
        raw = await self.raw.hgetall(self.broker.keys.record(job_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def ttl_ms(self, job_id: str) -> int:
        return int(await self.raw.pttl(self.broker.keys.record(job_id)))

    async def running_ids(self) -> list[str]:
        return [i.decode() for i in await self.raw.zrange(self.broker.keys.running, 0, -1)]

    async def stats(self) -> dict[str, str]:
        raw = await self.raw.hgetall(self.broker.keys.stats)
        return {k.decode(): v.decode() for k, v in raw.items()}


@pytest.fixture(params=KINDS)
async def kit(request: pytest.FixtureRequest, queue_names: Callable[[], str]) -> AsyncIterator[Kit]:
    queue = queue_names()  # its keys are deleted from the real Redis afterwards
    async with open_backend(request.param, queue) as backend:
        made: list[RedisBroker] = []

        def new_broker() -> RedisBroker:
            broker = backend.broker()
            assert isinstance(broker, RedisBroker)
            made.append(broker)
            return broker

        broker = new_broker()
        await broker.connect()
        await broker.start_consuming("c1")
        assert backend.raw is not None
        try:
            yield Kit(broker, backend.raw, new_broker)
        finally:
            for b in made:
                await b.close()


def job(n: int = 1, **fields: Any) -> aqw.Job:
    return aqw.Job(task="work", payload={"n": n}, **fields)


async def fetch_n(broker: RedisBroker, n: int, within: float = 5.0) -> list[Delivery]:
    deadline = time.monotonic() + within
    got: list[Delivery] = []
    while len(got) < n:
        await broker.promote_due()
        got += await broker.fetch(n - len(got), block=0.05)
        assert time.monotonic() < deadline, f"{len(got)} of {n} deliveries within {within}s"
    return got


async def start(broker: RedisBroker, ttl: float = 30.0) -> tuple[Delivery, aqw.Job, Lease]:
    """Fetch the next job and take its lease as the worker does."""
    [delivery] = await fetch_n(broker, 1)
    j = aqw.Job.decode(delivery.data)
    lease = Lease(broker.job_lease_backend(j), broker.job_lease_key(j), ttl=ttl)
    await lease.acquire()
    return delivery, j, lease


def failure(message: str = "boom") -> Failure:
    now = time.time()
    return Failure(
        error_type="ValueError",
        error=message,
        traceback="Traceback ...",
        worker="c1",
        first_failed_at=now,
        failed_at=now,
        fingerprint="fp-1",
    )


def near(value: str, expected: float, within: float = 5.0) -> bool:
    return abs(float(value) - expected) <= within


# -- the life of a job -------------------------------------------------------------------------


async def test_a_record_from_enqueue_through_progress_to_success(kit: Kit) -> None:
    b = kit.broker
    expires = time.time() + 600
    j = job(1, expires_at=expires)
    await b.publish([j])
    f = await kit.fields(j.id)
    assert f == {
        "state": "queued",
        "task": "work",
        "attempts": "0",
        "enqueued_at": repr(j.enqueued_at),
        "expires_at": repr(expires),  # fields a job does not have are not written
    }
    assert UNFINISHED_KEEP * 1000 - 10_000 < await kit.ttl_ms(j.id) <= UNFINISHED_KEEP * 1000
    info = await b.records.record(j.id)
    assert info is not None and info.state == "queued" and info.attempts == 0
    assert info.expires_at is not None and abs(info.expires_at.timestamp() - expires) < 1e-3

    delivery, j, lease = await start(b)
    now = time.time()
    f = await kit.fields(j.id)
    assert f["state"] == "running" and f["attempts"] == "1" and f["worker"] == "c1"
    assert f["fencing_token"] == str(lease.fencing_token) and lease.fencing_token > 0
    assert near(f["started_at"], now) and near(f["lease_expires_at"], now + 30)
    assert "progress" not in f and f["enqueued_at"] == repr(j.enqueued_at)
    assert await kit.running_ids() == []  # short jobs never enter the running index
    await b.records.set_running_state(
        j.id, {"fencing_token": str(lease.fencing_token)}
    )  # published
    assert await kit.running_ids() == [j.id]
    old_shape = {
        "state": "running",
        "job_id": j.id,
        "task": "work",
        "attempt": "1",
        "worker": "c1",
        "started_at": f["started_at"],
        "lease_expires_at": f["lease_expires_at"],
        "fencing_token": str(lease.fencing_token),
        "progress": "0.0",
        "message": "",
    }
    assert await b.records.running_states() == [old_shape]
    assert await b.records.running_state(j.id) == old_shape

    # progress under the job's own fencing token is written; under another, never
    state = {**old_shape, "progress": "0.5", "message": "half", "lease_expires_at": repr(now + 40)}
    await b.records.set_running_state(j.id, state)
    await b.records.set_running_state(
        j.id, {**state, "fencing_token": "999999", "message": "stale"}
    )
    f = await kit.fields(j.id)
    assert (f["progress"], f["message"], f["lease_expires_at"]) == ("0.5", "half", repr(now + 40))
    assert (await b.records.running_state(j.id) or {})["progress"] == "0.5"

    assert await b.ack(delivery, j, lease, finish=Finish(result='{"n": 1}', keep_for=60)) is True
    f = await kit.fields(j.id)
    assert f["state"] == "succeeded" and f["result"] == '{"n": 1}' and f["worker"] == "c1"
    assert near(f["finished_at"], time.time())
    assert 50_000 < await kit.ttl_ms(j.id) <= 60_000
    assert await kit.running_ids() == []
    assert (await kit.stats())["processed"] == "1"
    assert await b.records.running_states() == [] and await b.records.running_state(j.id) is None
    info = await b.records.record(j.id)
    assert info is not None and info.finished and info.result == {"n": 1} and info.has_result
    assert not await kit.raw.exists(b.keys.lease(j.id))

    # a late progress report does not touch the ended record
    await b.records.set_running_state(j.id, {**state, "progress": "0.9"})
    assert (await kit.fields(j.id))["progress"] == "0.5"
    assert (await kit.fields(j.id))["state"] == "succeeded"


async def test_retry_then_dead_letter_then_replay(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(2)])
    delivery, j, lease = await start(b)
    run_at = time.time() + 0.3
    assert await b.retry(delivery, j.next_attempt(), run_at, lease, failure=failure()) is True
    f = await kit.fields(j.id)
    assert f["state"] == "retrying" and f["run_at"] == repr(run_at) and f["attempts"] == "1"
    assert (f["error_type"], f["error"], f["fingerprint"]) == ("ValueError", "boom", "fp-1")
    assert f["traceback"] == "Traceback ..."
    assert await kit.ttl_ms(j.id) > UNFINISHED_KEEP * 1000 - 10_000
    assert await kit.running_ids() == []
    info = await b.records.record(j.id)
    assert info is not None and info.state == "retrying" and info.error is not None
    assert info.error.fingerprint == "fp-1"

    delivery, j2, lease = await start(b)  # promoted once due
    assert j2.attempt == 2
    f = await kit.fields(j.id)
    assert f["state"] == "running" and f["attempts"] == "2" and "run_at" not in f
    entry = await b.dead_letter(delivery, j2, failure("final"), 2, lease, keep_for=60)
    assert entry is not None
    f = await kit.fields(j.id)
    assert f["state"] == "dead" and f["dlq_entry"] == entry and f["error"] == "final"
    assert near(f["finished_at"], time.time())
    assert 50_000 < await kit.ttl_ms(j.id) <= 60_000
    assert await kit.running_ids() == []
    assert (await kit.stats())["dead"] == "1" and (await kit.stats())["retried"] == "1"
    info = await b.records.record(j.id)
    assert info is not None and info.state == "dead" and info.dlq_entry == entry

    fresh = j2.model_copy(update={"attempt": 1, "enqueued_at": time.time()})
    assert await b.dlq_replay([(entry, fresh)]) == 1
    f = await kit.fields(j.id)
    assert f["state"] == "queued" and f["attempts"] == "2"  # its story stays: it ran twice
    assert "finished_at" not in f and "dlq_entry" not in f
    assert f["error"] == "final"
    assert await kit.ttl_ms(j.id) > UNFINISHED_KEEP * 1000 - 10_000
    _, again, _ = await start(b)
    assert again.id == j.id


async def test_requeue_puts_a_running_record_back_to_queued(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(3)])
    delivery, j, lease = await start(b)
    assert await b.give_back(delivery, lease, j) is True
    assert (await kit.fields(j.id))["state"] == "queued"
    assert await kit.running_ids() == []
    _, again, _ = await start(b)
    assert again.id == j.id and (await kit.fields(j.id))["state"] == "running"


async def test_acks_count_and_record_each_final_state(kit: Kit) -> None:
    b = kit.broker
    jobs = [job(n) for n in range(3)]
    await b.publish(jobs)
    deliveries = await fetch_n(b, 3)
    by_id = {aqw.Job.decode(d.data).id: d for d in deliveries}
    failed, expired, ok = jobs
    d, f_lease = by_id[failed.id], Lease(b.job_lease_backend(failed), b.job_lease_key(failed))
    await f_lease.acquire()
    finish = Finish(state="failed", keep_for=60, failure=failure("gave up"))
    assert await b.ack(d, failed, f_lease, finish=finish) is True
    # an expired job is acknowledged without ever being started (no lease)
    assert await b.ack(by_id[expired.id], expired, None, finish=Finish(state="expired")) is True
    assert await b.ack(by_id[ok.id], ok, None) is True
    assert (await kit.fields(failed.id))["state"] == "failed"
    assert (await kit.fields(failed.id))["error"] == "gave up"
    assert (await kit.fields(expired.id))["state"] == "expired"
    assert (await kit.fields(expired.id))["attempts"] == "0"
    assert (await kit.fields(ok.id))["state"] == "succeeded"
    stats = await kit.stats()
    assert (stats["failed"], stats["expired"], stats["processed"]) == ("1", "1", "1")


async def test_enqueue_many_schedule_and_unique_write_records(kit: Kit) -> None:
    b = kit.broker
    many = [job(n) for n in range(2500)]  # three chunks
    await b.publish(many)
    pipe = kit.raw.pipeline(transaction=False)
    for j in many:
        pipe.hget(b.keys.record(j.id), "state")
    assert set(await pipe.execute()) == {b"queued"}
    assert await kit.raw.xlen(b.keys.stream) == 2500

    run_at = time.time() + 60
    later = [job(n) for n in range(3)]
    await b.schedule(later, run_at)
    for j in later:
        f = await kit.fields(j.id)
        assert f["state"] == "delayed" and f["run_at"] == repr(run_at)
        assert await kit.ttl_ms(j.id) > (UNFINISHED_KEEP + 50) * 1000
    info = await b.records.record(later[0].id)
    assert info is not None and info.state == "delayed"

    keyed = job(9, key="order-9")
    assert await b.publish_unique(keyed, 60, None) == (keyed.id, False)
    f = await kit.fields(keyed.id)
    assert f["state"] == "queued" and f["key"] == "order-9"
    dup = job(10, key="order-9")
    assert await b.publish_unique(dup, 60, None) == (keyed.id, True)
    assert await kit.fields(dup.id) == {}


# -- cancel --------------------------------------------------------------------------------------


async def test_cancel_in_each_state(kit: Kit) -> None:
    b = kit.broker
    assert await b.records.cancel("no-such-job") == "unknown"

    # queued: cancelled at once; the worker that fetches it cannot start it and acks it
    queued = job(1)
    await b.publish([queued])
    assert await b.records.cancel(queued.id, keep_for=60) == "cancelled"
    f = await kit.fields(queued.id)
    assert f["state"] == "cancelled" and f["cancel"] == "1" and near(f["finished_at"], time.time())
    # its message still waits in the stream: the record outlives it (as long as unfinished)
    assert await kit.ttl_ms(queued.id) > UNFINISHED_KEEP * 1000 - 10_000
    assert (await kit.stats())["cancelled"] == "1"
    fence_before = await kit.raw.get(b.keys.fence)
    [delivery] = await fetch_n(b, 1)
    lease = Lease(b.job_lease_backend(queued), b.job_lease_key(queued))
    with pytest.raises(JobCancelled):
        await lease.acquire()
    assert not await kit.raw.exists(b.keys.lease(queued.id))
    assert await kit.raw.get(b.keys.fence) == fence_before
    assert await b.ack(delivery, queued, None, finish=Finish(state="cancelled")) is True
    assert await kit.fields(queued.id) == f  # already ended: left as it was, not recounted
    assert (await kit.stats())["cancelled"] == "1"
    assert await kit.raw.xlen(b.keys.stream) == 0
    assert await b.records.cancel(queued.id) == "finished"

    # delayed and retrying: cancelled too
    delayed = job(2)
    await b.schedule([delayed], time.time() + 60)
    assert await b.records.cancel(delayed.id) == "cancelled"
    await b.publish([job(3)])
    delivery, retried, lease = await start(b)
    assert await b.retry(delivery, retried.next_attempt(), time.time() + 60, lease) is True
    assert await b.records.cancel(retried.id) == "cancelled"
    assert (await kit.fields(retried.id))["state"] == "cancelled"

    # running: asked to stop; the record stays running until the worker ends it
    await b.publish([job(4)])
    delivery, running, lease = await start(b)
    assert await b.records.cancel_requested(running.id) is False
    assert await b.records.cancel(running.id) == "cancelling"
    assert await b.records.cancel_requested(running.id) is True
    assert await b.records.cancel_requested(delayed.id) is True
    assert await b.records.cancel_requested("no-such-job") is False
    f = await kit.fields(running.id)
    assert f["state"] == "running" and f["cancel"] == "1"
    info = await b.records.record(running.id)
    assert info is not None and info.cancel_requested and not info.finished
    assert await b.ack(delivery, running, lease, finish=Finish(state="cancelled")) is True
    assert (await kit.fields(running.id))["state"] == "cancelled"
    assert await b.records.cancel(running.id) == "finished"
    assert (await kit.stats())["cancelled"] == "4"


# -- expiry and refusals -------------------------------------------------------------------------


async def test_records_expire_after_keep_for(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(1), job(2)])
    delivery, done, lease = await start(b)
    assert await b.ack(delivery, done, lease, finish=Finish(keep_for=0.2)) is True
    delivery, dead, lease = await start(b)
    assert await b.dead_letter(delivery, dead, failure(), 1, lease, keep_for=0.2)
    assert await kit.raw.exists(b.keys.record(done.id), b.keys.record(dead.id)) == 2
    await asyncio.sleep(0.35)
    assert await kit.raw.exists(b.keys.record(done.id), b.keys.record(dead.id)) == 0
    assert await b.records.record(done.id) is None
    assert await b.records.cancel(done.id) == "unknown"
    with pytest.raises(UnknownJob):
        await b.records.wait_finished(done.id, 1.0)


async def test_settles_refused_for_another_holder_leave_the_record_alone(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(1)])
    delivery, j, lease = await start(b)
    # the lease expired and another holder took the job: as job_start.lua does, its lease
    # and its fencing token in the record (the ack goes by the record's token)
    await kit.raw.set(b.keys.lease(j.id), "someone-else", px=30_000)
    await kit.raw.hset(b.keys.record(j.id), "fencing_token", str(lease.fencing_token + 1))
    before = await kit.fields(j.id)
    assert await b.ack(delivery, j, lease, finish=Finish(result="1")) is False
    assert await b.retry(delivery, j.next_attempt(), time.time(), lease, failure()) is False
    assert await b.dead_letter(delivery, j, failure(), 1, lease) is None
    assert await kit.fields(j.id) == before
    assert await kit.running_ids() == []  # it enters the index when its state is published
    assert await kit.stats() == {}
    # a second acquire by another token is refused (0), and changes nothing
    other = Lease(b.job_lease_backend(j), b.job_lease_key(j), ttl=30)
    with pytest.raises(aqw.LeaseUnavailable):
        await other.acquire()
    assert await kit.fields(j.id) == before


async def test_an_ack_goes_by_the_records_fencing_token(kit: Kit) -> None:
    """The ack skips the lease key while the record names its lease's fencing token and no
    other consumer has claimed the delivery: a lease that expired untaken still settles; a
    delivery claimed by another consumer since (reclaim.lua marks the record) is refused, its
    record left alone, whatever the record's token says."""
    b = kit.broker
    await b.publish([job(1)])
    delivery, j, lease = await start(b)
    assert (await kit.fields(j.id))["fencing_token"] == str(lease.fencing_token)
    await kit.raw.delete(b.keys.lease(j.id))  # expired, nobody took it
    assert await b.ack(delivery, j, lease, finish=Finish(result="1")) is True
    assert (await kit.fields(j.id))["state"] == "succeeded"
    assert await kit.stats() == {"processed": "1"}
    # the next job: its lease expires and another consumer claims the delivery, not yet started
    await b.publish([job(2)])
    delivery, j, lease = await start(b, ttl=0.05)
    other = kit.new_broker()
    await other.connect()
    await other.start_consuming("c2")
    await kit.raw.delete(b.keys.lease(j.id))
    [again] = await eventually_reclaimed(other)
    assert again.id == delivery.id
    before = await kit.fields(j.id)
    assert before["claimed"] == "c2" and before["fencing_token"] == str(lease.fencing_token)
    assert await b.ack(delivery, j, lease, finish=Finish(result="2")) is False
    assert await kit.fields(j.id) == before
    assert await kit.stats() == {"processed": "1"}
    # the consumer that claimed it starts and settles it
    mine = Lease(other.job_lease_backend(j, None, again), other.job_lease_key(j), ttl=30)
    await mine.acquire()
    assert await other.ack(again, j, mine, finish=Finish(result="2")) is True
    assert (await kit.fields(j.id))["state"] == "succeeded"
    assert await kit.raw.exists(b.keys.lease(j.id)) == 0
    assert await kit.stats() == {"processed": "2"}


async def eventually_reclaimed(broker: RedisBroker, within: float = 10.0) -> list[Delivery]:
    """What ``broker`` reclaims once the pending entry has been idle 50 ms."""
    deadline = time.monotonic() + within
    while True:
        got = await broker.reclaim(10, lambda _: 0.05, 0.05)
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.02)


async def test_progress_never_resurrects_a_record(kit: Kit) -> None:
    b = kit.broker
    state = {"fencing_token": "1", "progress": "0.5", "message": "m", "lease_expires_at": "1.0"}
    await b.records.set_running_state("absent", state)
    assert not await kit.raw.exists(b.keys.record("absent"))
    await b.publish([job(1)])
    _, j, lease = await start(b)
    mine = {**state, "fencing_token": str(lease.fencing_token)}
    # without a fencing token nothing is written
    await b.records.set_running_state(j.id, {k: v for k, v in mine.items() if k != "fencing_token"})
    assert "progress" not in await kit.fields(j.id)
    # the record keeps its TTL while more than half of UNFINISHED_KEEP is left...
    keep_ms = int(UNFINISHED_KEEP * 1000)
    await kit.raw.pexpire(b.keys.record(j.id), int(keep_ms * 0.6))
    await b.records.set_running_state(j.id, mine)
    assert (await kit.fields(j.id))["progress"] == "0.5"
    assert await kit.ttl_ms(j.id) <= keep_ms * 0.6
    # ...and gets it again when less is left (a job running for days)
    await kit.raw.pexpire(b.keys.record(j.id), 100_000)
    await b.records.set_running_state(j.id, {**mine, "progress": "0.6"})
    assert (await kit.fields(j.id))["progress"] == "0.6"
    assert await kit.ttl_ms(j.id) > keep_ms - 10_000


async def test_renewal_moves_the_lease_expiry_and_a_lapsed_job_stays_running(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(1), job(2)])
    _, alive, lease = await start(b)
    _, gone, lease_g = await start(b)
    key = b.job_lease_key(alive)
    backend = lease.backend
    await kit.raw.hset(b.keys.record(alive.id), "lease_expires_at", repr(time.time() - 100))
    renewed_at = time.monotonic()
    assert await backend.renew(key, lease.token, 20_000) is True
    f = await kit.fields(alive.id)
    assert near(f["lease_expires_at"], time.time() + 20, 1.0)
    assert ttl_agrees(await kit.raw.pttl(key), 20_000, since=renewed_at)
    assert await backend.renew(key, "not-the-token", 20_000) is False
    assert near((await kit.fields(alive.id))["lease_expires_at"], time.time() + 20, 1.0)
    # its worker died: still running (its lease expiry in the past shows it orphaned)
    lapsed = repr(time.time() - 10)
    await kit.raw.hset(b.keys.record(gone.id), "lease_expires_at", lapsed)
    for run, held in ((alive, lease), (gone, lease_g)):  # published: listed as running
        await b.records.set_running_state(run.id, {"fencing_token": str(held.fencing_token)})
    states = {s["job_id"]: s for s in await b.records.running_states()}
    assert set(states) == {alive.id, gone.id}
    assert states[gone.id]["lease_expires_at"] == lapsed
    assert len(await b.records.running_states(limit=1)) == 1
    assert lease_g.fencing_token > lease.fencing_token


async def test_a_job_cancelled_while_running_does_not_run_again(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(1)])
    delivery, j, lease = await start(b)
    assert await b.records.cancel(j.id) == "cancelling"
    assert await b.give_back(delivery, lease, j) is True  # handed back (a shutdown)
    assert (await kit.fields(j.id))["state"] == "queued"
    [again] = await fetch_n(b, 1)
    with pytest.raises(JobCancelled):
        await Lease(b.job_lease_backend(j), b.job_lease_key(j)).acquire()
    assert not await kit.raw.exists(b.keys.lease(j.id))
    assert await b.ack(again, j, None, finish=Finish(state="cancelled")) is True
    assert (await kit.fields(j.id))["state"] == "cancelled"


async def test_damaged_counter_and_records_are_tolerated(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(1)])
    [delivery] = await fetch_n(b, 1)
    j = aqw.Job.decode(delivery.data)
    await kit.raw.set(b.keys.fence, "not-a-number")
    with pytest.raises(FenceCorrupted):
        await Lease(b.job_lease_backend(j), b.job_lease_key(j)).acquire()
    assert (await kit.fields(j.id))["state"] == "queued"
    assert not await kit.raw.exists(b.keys.lease(j.id))
    await kit.raw.delete(b.keys.fence)
    # a record key of another type: the job still runs and settles; the record reads as none
    await kit.raw.set(b.keys.record(j.id), "not a hash")
    lease = Lease(b.job_lease_backend(j), b.job_lease_key(j))
    await lease.acquire()
    assert lease.fencing_token == 1
    assert await b.records.record(j.id) is None
    assert await b.records.cancel(j.id) == "unknown"
    assert await b.records.cancel_requested(j.id) is False
    damaged = await b.records.running_state(j.id)
    assert damaged is not None and "not a hash" in damaged["damaged"]
    assert await b.ack(delivery, j, lease) is True
    assert await kit.raw.get(b.keys.record(j.id)) == b"not a hash"
    # an id in the running index whose record has ended or gone is dropped from it
    await kit.raw.zadd(b.keys.running, {"ghost": 1.0})
    assert await b.records.running_states() == []
    assert await kit.raw.zscore(b.keys.running, "ghost") is None


# -- waiting for the end -------------------------------------------------------------------------


def pool_counts(broker: RedisBroker) -> tuple[int, int]:
    """(connections the client's pool has made, connections in use now)."""
    pool: Any = broker.client.connection_pool
    in_use = len(pool._in_use_connections)
    return len(pool._available_connections) + in_use, in_use


async def test_many_waiters_share_one_blocked_connection(kit: Kit) -> None:
    worker = kit.broker
    caller = kit.new_broker()  # another process's broker, which only waits
    await caller.connect()
    jobs = [job(n) for n in range(200)]
    await worker.publish(jobs)
    deliveries = await fetch_n(worker, 200)
    decoded = [aqw.Job.decode(d.data) for d in deliveries]
    leases = [Lease(worker.job_lease_backend(j), worker.job_lease_key(j)) for j in decoded]
    await asyncio.gather(*(lease.acquire() for lease in leases))

    waits = [asyncio.create_task(caller.records.wait_finished(j.id, 20)) for j in jobs]

    async def registered() -> bool:
        pipe = kit.raw.pipeline(transaction=False)
        for j in jobs:
            pipe.sismember(caller.keys.waiters(j.id), caller.waiters.inbox)
        return all(await pipe.execute())

    await eventually(registered, 10, "200 waiters registered")
    assert not any(w.done() for w in waits)
    assert caller.waiters.listening
    made, _ = pool_counts(caller)
    assert made <= 3, f"{made} connections for 200 waiters"

    finishes = [Finish(result=json.dumps({"n": j.payload["n"]}), keep_for=60) for j in decoded]
    acks = await asyncio.gather(
        *(
            worker.ack(d, j, lease, finish=f)
            for d, j, lease, f in zip(deliveries, decoded, leases, finishes, strict=True)
        )
    )
    assert all(acks)
    infos = await asyncio.wait_for(asyncio.gather(*waits), 10)
    for j, info in zip(jobs, infos, strict=True):
        assert (
            info.id == j.id and info.state == "succeeded" and info.result == {"n": j.payload["n"]}
        )
    made, _ = pool_counts(caller)
    assert made <= 3, f"{made} connections for 200 waiters"
    # woken waiters leave nothing behind; the listener stops within its block
    assert not await kit.raw.exists(*(caller.keys.waiters(j.id) for j in jobs))
    await eventually(lambda: not caller.waiters.listening, 5, "the listener to stop")
    assert pool_counts(caller)[1] == 0


async def test_waiting_for_an_ended_job_returns_at_once(kit: Kit) -> None:
    b = kit.broker
    await b.publish([job(1)])
    delivery, j, lease = await start(b)
    assert await b.ack(delivery, j, lease, finish=Finish(result="7")) is True
    # At once: nothing pushes an end that has happened, so a wait that listened would time out.
    info = await b.records.wait_finished(j.id, 5)
    assert info.state == "succeeded" and info.result == 7
    assert not b.waiters.listening  # nothing to listen for
    with pytest.raises(UnknownJob):
        await b.records.wait_finished("no-such-job", 5)


async def test_a_wait_times_out_and_leaves_the_waiters_set(kit: Kit) -> None:
    b = kit.broker
    j = job(1)
    await b.publish([j])
    timeout = 0.3
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await b.records.wait_finished(j.id, timeout)
    assert time.monotonic() - started >= timeout  # not before its time
    assert len(b.waiters) == 0
    # the best-effort SREM (sent without waiting) has left the set, so it is gone
    await eventually(_empty(kit, b.keys.waiters(j.id)), 2, "the waiters set to be left")


def _empty(kit: Kit, key: str) -> Callable[[], Any]:
    async def check() -> bool:
        return int(await kit.raw.scard(key)) == 0

    return check


async def test_cancel_and_dead_letter_wake_their_waiters(kit: Kit) -> None:
    b = kit.broker
    caller = kit.new_broker()
    cancelled, dead = job(1), job(2)
    await b.publish([cancelled])
    waiting = asyncio.create_task(caller.records.wait_finished(cancelled.id, 10))
    await eventually(
        _member(kit, caller.keys.waiters(cancelled.id), caller.waiters.inbox), 5, "registered"
    )
    assert await b.records.cancel(cancelled.id) == "cancelled"
    info = await asyncio.wait_for(waiting, 5)
    assert info.state == "cancelled"

    [delivery] = await fetch_n(b, 1)  # the cancelled job: acked without running
    await b.ack(delivery, cancelled, None, finish=Finish(state="cancelled"))
    await b.publish([dead])
    delivery, j, lease = await start(b)
    waiting = asyncio.create_task(caller.records.wait_finished(dead.id, 10))
    await eventually(
        _member(kit, caller.keys.waiters(dead.id), caller.waiters.inbox), 5, "registered"
    )
    entry = await b.dead_letter(delivery, j, failure(), 1, lease)
    info = await asyncio.wait_for(waiting, 5)
    assert info.state == "dead" and info.dlq_entry == entry
    assert info.error is not None and info.error.message == "boom"


def _member(kit: Kit, key: str, member: str) -> Callable[[], Any]:
    async def check() -> bool:
        return bool(await kit.raw.sismember(key, member))

    return check


async def test_the_listener_survives_connection_errors_and_lost_replies(kit: Kit) -> None:
    """A pop that fails, and one whose reply (carrying the job's id) is lost with the
    connection: the listener retries with backoff and then reads the awaited jobs' states."""
    b = kit.broker
    caller = kit.new_broker()
    await b.publish([job(1)])
    delivery, j, lease = await start(b)
    real = caller.client.blpop
    calls: list[str] = []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if len(calls) == 0:
            calls.append("refused")
            raise redis.exceptions.ConnectionError("injected: connection refused")
        if len(calls) == 1:
            reply = await real(*args, **kwargs)  # pops the id, then the reply is lost
            if reply:
                calls.append("lost")
                raise redis.exceptions.ConnectionError("injected: reply lost")
            return reply
        calls.append("ok")
        return await real(*args, **kwargs)

    caller.client.blpop = flaky  # type: ignore[method-assign]
    waiting = asyncio.create_task(caller.records.wait_finished(j.id, 10))
    await eventually(lambda: calls, 5, "a first pop")
    await eventually(_member(kit, caller.keys.waiters(j.id), caller.waiters.inbox), 5, "registered")
    assert await b.ack(delivery, j, lease, finish=Finish(result="3")) is True
    info = await asyncio.wait_for(waiting, 8)
    assert info.state == "succeeded" and info.result == 3
    assert calls[:2] == ["refused", "lost"]


async def test_close_stops_the_listener_and_fails_the_waits(kit: Kit) -> None:
    caller = kit.new_broker()
    j = job(1)
    await kit.broker.publish([j])
    waiting = asyncio.create_task(caller.records.wait_finished(j.id, None))
    await eventually(lambda: caller.waiters.listening, 5, "the listener")
    await caller.close()
    assert not caller.waiters.listening
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(waiting, 5)
