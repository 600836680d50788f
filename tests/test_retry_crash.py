"""A crash during a retry or dead-letter move neither loses nor duplicates the job.

End to end: a worker process (tests/scripts/retry_crash_worker.py) on the real Redis is
SIGKILLed exactly before or exactly after its settle step (retry -> delayed ZSET, or
dead-letter -> DLQ) is sent; a fresh worker then recovers the job: it ends exactly once
completed or in the DLQ, never both, never twice in the delayed set or the stream.

One step at a time, through the broker: retry and dead_letter move the stream entry, its PEL
record, the lease, the ZSET/DLQ entry and the job's record together, or refuse and change
nothing.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import fakeredis
import pytest
from conftest import REDIS_BACKENDS, REDIS_URL, Backend, require_real_redis
from redis.asyncio import Redis

import aqw
from aqw._redis.keys import GROUP, QueueKeys
from aqw.brokers.base import Delivery, Failure
from aqw.brokers.redis import RedisBroker
from aqw.lease import Lease
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(45)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "retry_crash_worker.py"
LEASE_TTL = 0.5
RECLAIM_IDLE = LEASE_TTL * 1.1 + 0.2  # the runtime reclaims entries idle longer than this


async def queue_state(client: Redis, keys: QueueKeys) -> dict[str, int]:
    """How many entries the stream, the PEL, the delayed set and the DLQ hold, and leases."""
    try:
        pending = int((await client.xpending(keys.stream, GROUP))["pending"])
    except Exception:
        pending = 0
    leases = [k async for k in client.scan_iter(match=keys.lease("*"), count=1000)]
    return {
        "stream": await client.xlen(keys.stream),
        "pending": pending,
        "delayed": await client.zcard(keys.delayed),
        "dlq": await client.xlen(keys.dlq),
        "leases": len(leases),
    }


@pytest.fixture
async def raw() -> AsyncIterator[Redis]:
    require_real_redis()
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


# -- SIGKILL mid-settle, then recovery by a fresh worker -------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["retry-before", "retry-after", "dead-before", "dead-after"])
async def test_a_worker_killed_mid_settle_loses_and_duplicates_nothing(
    mode: str, queue_name: str, tmp_path: Path, subprocess_env: dict[str, str], raw: Redis
) -> None:
    step, when = mode.split("-")
    keys = QueueKeys(queue_name)
    producer = aqw.App(RedisBroker(REDIS_URL, queue_name))

    @producer.task(name="fragile")
    async def fragile(n: int) -> None:
        raise AssertionError("the producer runs nothing")

    job_id = await fragile.enqueue(7)
    await producer.close()

    marker = tmp_path / "settling"
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(  # noqa: ASYNC220 - killed with SIGKILL below
        [sys.executable, str(SCRIPT), queue_name, str(marker), mode, str(LEASE_TTL)],
        env=subprocess_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker never reached its settle step"
            await asyncio.sleep(0.005)
        # the moment of the crash: exactly one of "still pending" / "moved" holds
        at_crash = await queue_state(raw, keys)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    assert proc.returncode == -signal.SIGKILL
    # What was left of the dead worker's lease after the kill (read after it): recovery follows
    # the job's own lease, so a rerun comes no sooner than that, however loaded the machine.
    lease_left = 0.0
    if when == "before":
        lease_keys = [k async for k in raw.scan_iter(match=keys.lease("*"), count=1000)]
        lease_left = max([await raw.pttl(k) for k in lease_keys] + [0]) / 1000
    crashed_runs = (Path(f"{marker}.runs")).read_text().split()  # noqa: ASYNC240
    assert crashed_runs[0] == "1" and len(crashed_runs) == 2  # one run: attempt 1

    if when == "before":  # nothing written: the entry is still pending for the dead consumer
        assert (at_crash["stream"], at_crash["pending"], at_crash["delayed"], at_crash["dlq"]) == (
            1,
            1,
            0,
            0,
        )
    elif step == "retry":  # the next attempt is scheduled and the entry gone, in one step
        # Scheduled with a 10-20 ms backoff: the still-running worker may have promoted it
        # to the stream before the snapshot (a loaded machine is slow to take it). Either
        # way there is exactly one next attempt, and the delivered entry is gone.
        assert (at_crash["pending"], at_crash["dlq"], at_crash["leases"]) == (0, 0, 0), at_crash
        assert at_crash["stream"] + at_crash["delayed"] == 1, at_crash
        delayed = await raw.zrange(keys.delayed, 0, -1)
        promoted = [fields[b"j"] for _, fields in await raw.xrange(keys.stream)]
        [scheduled] = delayed + promoted
        job = aqw.Job.decode(scheduled)
        assert (job.id, job.attempt) == (job_id, 2)
    else:
        assert at_crash == {"stream": 0, "pending": 0, "delayed": 0, "dlq": 1, "leases": 0}

    # a fresh worker recovers what the dead one left
    fresh = aqw.App(
        RedisBroker(REDIS_URL, queue_name),
        lease_ttl=LEASE_TTL,
        retry=aqw.RetryPolicy(max_retries=3 if step == "retry" else 0, base=0.01, cap=0.02),
    )
    seen: list[tuple[str, int, float]] = []

    @fresh.task(name="fragile")
    async def fragile_again(n: int, ctx: aqw.Context) -> None:
        seen.append((ctx.job_id, ctx.attempt, time.monotonic() - killed_at))
        if step == "dead":
            raise ValueError(f"fragile {n} failed again")

    try:
        async with fresh.worker(concurrency=4) as worker:
            if mode == "dead-after":
                await asyncio.sleep(RECLAIM_IDLE + 0.5)  # nothing may turn up
            else:
                await eventually(
                    lambda: worker.stats.processed + worker.stats.dead >= 1, 10, "recovery"
                )
                await asyncio.sleep(RECLAIM_IDLE + 0.3)  # time for a wrong second run
        dead = await fresh.dlq.list()
        stats = await fresh.broker.stats()
    finally:
        await fresh.close()

    s = worker.stats
    if mode == "retry-before":
        # the retry was never written: the same attempt runs again, after the reclaim idle time
        assert [(j, a) for j, a, _ in seen] == [(job_id, 1)]
        assert seen[0][2] >= lease_left - 0.005, (seen, lease_left)
        assert (s.processed, s.dead, s.retried) == (1, 0, 0)
        assert dead == []
    elif mode == "retry-after":
        assert [(j, a) for j, a, _ in seen] == [(job_id, 2)]
        assert (s.processed, s.dead, s.retried) == (1, 0, 0)
        assert dead == []
        assert stats.get("retried") == 1
    elif mode == "dead-before":
        assert [(j, a) for j, a, _ in seen] == [(job_id, 1)]
        assert (s.processed, s.dead) == (0, 1)
        assert [(d.job_id, d.error_type, d.attempts) for d in dead] == [(job_id, "ValueError", 1)]
        assert dead[0].worker == worker.name
    else:
        assert seen == []
        assert s.as_dict() == aqw.WorkerStats().as_dict()
        assert [(d.job_id, d.error_type, d.attempts) for d in dead] == [(job_id, "ValueError", 1)]
        assert dead[0].worker != worker.name  # written by the killed worker, before the kill
    completed = stats.get("processed", 0)
    assert completed + len(dead) == 1, "the job must end exactly once: completed or dead"
    assert await queue_state(raw, keys) == {
        "stream": 0,
        "pending": 0,
        "delayed": 0,
        "dlq": len(dead),
        "leases": 0,
    }


# -- the settle steps, one broker step at a time --------------------------------------------------
#
# Driven through a RedisBroker on the same client (consumer "c1"), so these tests pin what
# each step moves, not the scripts' KEYS/ARGV layouts.


@dataclass(frozen=True, slots=True)
class HeldLease:
    """What a settle step reads of the job's lease: its key and this holder's token."""

    key: str
    token: str


FAILURE = Failure(
    error_type="ValueError",
    error="ValueError: no",
    worker="w1",
    first_failed_at=1.0,
    failed_at=2.0,
    fingerprint="fp-1",
)


class Stage:
    """A queue with one job fetched by consumer ``c1``, started by it (its record reads
    running) with its lease token ``tok``; the lease may since have lapsed (``lease_owner``
    None) or been taken by another holder (any other ``lease_owner``)."""

    def __init__(self, client: Redis, queue: str) -> None:
        self.client = client
        self.queue = queue
        self.keys = QueueKeys(queue)
        self.broker = RedisBroker(client, queue)
        self.job = aqw.Job(task="t", payload={"n": 1})
        self.delivery = Delivery("", b"")

    @property
    def entry(self) -> str:
        return self.delivery.id

    @property
    def lease(self) -> Lease:
        return cast(Lease, HeldLease(self.keys.lease(self.job.id), "tok"))

    async def consumer(self, name: str, dlq_limit: int = 100_000) -> RedisBroker:
        """Another broker on the same client and queue, consuming as ``name``."""
        broker = RedisBroker(self.client, self.queue, dlq_limit=dlq_limit)
        await broker.start_consuming(name)
        return broker

    async def setup(self, lease_owner: str | None = "tok") -> Stage:
        await self.broker.connect()
        await self.broker.start_consuming("c1")
        await self.broker.publish([self.job])
        [self.delivery] = await self.broker.fetch(1, 0.1)
        fence = await self.broker.job_lease_backend(self.job).acquire(
            self.keys.lease(self.job.id), "tok", 30_000
        )
        assert fence, "c1 could not start the job"
        assert await self.record_state() == "running"
        if lease_owner is None:  # the lease lapsed and nobody took it
            await self.client.delete(self.keys.lease(self.job.id))
        elif lease_owner != "tok":  # another holder took the lease
            await self.client.set(self.keys.lease(self.job.id), lease_owner, px=30_000)
        return self

    async def retry(self, due: float = 0.0) -> bool:
        return await self.broker.retry(
            self.delivery, self.job.next_attempt(), due, self.lease, FAILURE
        )

    async def dead_letter(self, limit: int = 100, entry: str | None = None) -> str | None:
        broker = self.broker if limit == 100 else await self.consumer("c1", dlq_limit=limit)
        delivery = self.delivery if entry is None else Delivery(entry, self.delivery.data)
        return await broker.dead_letter(delivery, self.job, FAILURE, 1, self.lease)

    async def promote(self) -> float | None:
        return await self.broker.promote_due()

    async def record(self) -> aqw.JobInfo:
        info = await self.broker.records.record(self.job.id)
        assert info is not None, "the job has no record"
        return info

    async def record_state(self) -> str:
        return (await self.record()).state

    async def state(self) -> dict[str, Any]:
        k = self.keys
        stats = {x.decode(): int(v) for x, v in (await self.client.hgetall(k.stats)).items()}
        lease = await self.client.get(k.lease(self.job.id))
        return {
            **{n: v for n, v in (await queue_state(self.client, k)).items() if n != "leases"},
            "lease": lease.decode() if lease else None,
            "stats": stats,
        }


@pytest.fixture(params=REDIS_BACKENDS)
async def stage(
    request: pytest.FixtureRequest, queue_name: str
) -> AsyncIterator[Callable[..., Awaitable[Stage]]]:
    client: Redis
    if request.param == "redis":
        require_real_redis()
        client = Redis.from_url(REDIS_URL)
    else:
        client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())

    async def make(lease_owner: str | None = "tok") -> Stage:
        return await Stage(client, queue_name).setup(lease_owner)

    try:
        yield make
    finally:
        await client.aclose()


UNTOUCHED = {"stream": 1, "pending": 1, "delayed": 0, "dlq": 0, "lease": "tok", "stats": {}}


async def test_retry_step_moves_everything_in_one_step(
    stage: Callable[..., Awaitable[Stage]],
) -> None:
    s = await stage()
    assert await s.state() == UNTOUCHED
    assert await s.retry(due=1.234) is True
    assert await s.state() == {
        "stream": 0,
        "pending": 0,
        "delayed": 1,
        "dlq": 0,
        "lease": None,
        "stats": {"retried": 1},
    }
    [(member, score)] = await s.client.zrange(s.keys.delayed, 0, -1, withscores=True)
    nxt = aqw.Job.decode(member)
    assert (nxt.id, nxt.attempt, nxt.payload, score) == (s.job.id, 2, {"n": 1}, 1234)
    # the record moved in the same step: retrying, with its run_at, runs so far, last error
    info = await s.record()
    assert (info.state, info.attempts) == ("retrying", 1)
    assert info.run_at is not None and info.run_at.timestamp() == pytest.approx(1.234)
    assert info.error is not None
    assert (info.error.type, info.error.message, info.error.fingerprint) == (
        "ValueError",
        "ValueError: no",
        "fp-1",
    )
    assert await s.broker.records.running_states() == []  # no longer running


async def test_retry_step_without_a_lease_record_still_moves(
    stage: Callable[..., Awaitable[Stage]],
) -> None:
    s = await stage(lease_owner=None)  # the lease expired and nobody took it
    assert await s.retry() is True
    assert (await s.state())["delayed"] == 1
    assert await s.record_state() == "retrying"


@pytest.mark.parametrize("step", ["retry", "dead_letter"])
async def test_a_step_refused_for_another_holder_changes_nothing(
    stage: Callable[..., Awaitable[Stage]], step: str
) -> None:
    s = await stage(lease_owner="someone-else")
    result = await (s.retry() if step == "retry" else s.dead_letter())
    assert result in (False, None)
    assert await s.state() == {**UNTOUCHED, "lease": "someone-else"}
    assert await s.record_state() == "running"  # the record is the holder's, untouched


async def test_dead_letter_step_moves_everything_in_one_step(
    stage: Callable[..., Awaitable[Stage]],
) -> None:
    s = await stage()
    entry = await s.dead_letter()
    assert entry
    assert await s.state() == {
        "stream": 0,
        "pending": 0,
        "delayed": 0,
        "dlq": 1,
        "lease": None,
        "stats": {"dead": 1},
    }
    [(dlq_id, fields)] = await s.client.xrange(s.keys.dlq)
    assert dlq_id.decode() == entry
    f = {k.decode(): v.decode() for k, v in fields.items()}
    assert aqw.Job.decode(f["j"]) == s.job
    assert (f["job_id"], f["error_type"], f["attempts"], f["worker"]) == (
        s.job.id,
        "ValueError",
        "1",
        "w1",
    )
    # the record reads dead in the same step and names the DLQ entry
    info = await s.record()
    assert (info.state, info.dlq_entry) == ("dead", entry)
    assert info.error is not None and info.error.type == "ValueError"
    assert info.finished_at is not None
    assert await s.broker.records.running_states() == []


async def test_dead_letter_step_trims_the_dlq_and_counts_it(
    stage: Callable[..., Awaitable[Stage]],
) -> None:
    s = await stage(lease_owner=None)
    entries = []
    for _ in range(4):  # entry '': a message that never was a stream entry of this worker
        entry = await s.dead_letter(limit=2, entry="")
        assert entry
        entries.append(entry)
    state = await s.state()
    assert (state["dlq"], state["stats"]) == (2, {"dead": 4, "dlq_trimmed": 2})
    assert (state["stream"], state["pending"]) == (1, 1)  # the stream entry is not touched
    assert [d.id for d in await s.broker.dlq_list()] == entries[2:]  # the oldest trimmed
    info = await s.record()
    assert (info.state, info.dlq_entry) == ("dead", entries[-1])


async def test_promote_moves_due_jobs_once(stage: Callable[..., Awaitable[Stage]]) -> None:
    s = await stage()
    assert await s.retry(due=time.time() - 0.01) is True
    later = s.job.model_copy(update={"id": "later"})
    await s.broker.schedule([later], time.time() + 60)
    next_due = await s.promote()
    assert next_due is not None and 50 < next_due <= 60
    state = await s.state()
    assert (state["stream"], state["pending"], state["delayed"]) == (1, 0, 1)  # one moved
    again = await s.promote()
    assert again is not None and 50 < again <= next_due
    state = await s.state()
    assert (state["stream"], state["pending"], state["delayed"]) == (1, 0, 1)  # not twice
    [(_, fields)] = await s.client.xrange(s.keys.stream)
    assert aqw.Job.decode(fields[b"j"]).attempt == 2
    [member] = await s.client.zrange(s.keys.delayed, 0, -1)
    assert aqw.Job.decode(member).id == "later"


# -- a settle step sent twice (a lost reply), or by an ex-holder -----------------------------------
#
# redis-py re-sends a command after a connection error (retry_on_error) and so does
# Worker._with_retries: a step whose reply was lost may run twice. Each step must act only on
# an entry that is still pending, so the second run (or a paused ex-holder's late step, after
# another worker settled the entry) changes nothing.


async def test_a_retry_step_sent_twice_schedules_once(
    stage: Callable[..., Awaitable[Stage]],
) -> None:
    s = await stage()
    assert await s.retry() is True
    await s.promote()
    assert (await s.state())["stream"] == 1  # the next attempt is already in the stream
    assert await s.retry() is False  # the same step again, e.g. re-sent after its reply was lost
    state = await s.state()
    assert (state["stream"], state["pending"], state["delayed"]) == (1, 0, 0)
    assert state["stats"] == {"retried": 1}
    assert await s.record_state() == "retrying"


async def test_a_dead_letter_step_sent_twice_writes_one_entry(
    stage: Callable[..., Awaitable[Stage]],
) -> None:
    s = await stage()
    entry = await s.dead_letter()
    assert entry
    assert await s.dead_letter() is None
    state = await s.state()
    assert (state["dlq"], state["stream"], state["stats"]) == (1, 0, {"dead": 1})
    info = await s.record()
    assert (info.state, info.dlq_entry) == ("dead", entry)  # still the first entry's


@pytest.mark.parametrize("step", ["retry", "dead_letter"])
async def test_an_ex_holders_late_step_after_another_settled_changes_nothing(
    stage: Callable[..., Awaitable[Stage]], step: str
) -> None:
    s = await stage(lease_owner=None)  # c1's lease expired...
    # ...another worker reclaimed the entry, ran the job and acknowledged it
    other = await s.consumer("c2")
    await asyncio.sleep(0.05)  # idle past the 10 ms the reclaim asks for
    [taken] = await other.reclaim(1, lambda job: 0.01, 0.01)
    assert (taken.id, taken.delivery_count) == (s.entry, 2)
    assert await other.ack(taken, s.job, None) is True
    after_other = await s.state()
    assert after_other == {
        "stream": 0,
        "pending": 0,
        "delayed": 0,
        "dlq": 0,
        "lease": None,
        "stats": {"processed": 1},
    }
    result = await (s.retry() if step == "retry" else s.dead_letter())
    assert result in (False, None)
    assert await s.state() == after_other
    assert await s.record_state() == "succeeded"  # the other holder's end stands


async def test_a_lost_reply_to_the_retry_step_does_not_run_the_next_attempt_twice(
    redis_backend: Backend,
) -> None:
    app = redis_backend.app(retry=aqw.RetryPolicy(max_retries=3, base=0.01, cap=0.02))
    runs: list[int] = []

    @app.task(name="once")
    async def once(ctx: aqw.Context) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise aqw.Retry(delay=0)

    broker = app.broker
    assert isinstance(broker, RedisBroker)
    original = broker.retry
    calls = 0

    async def reply_lost(*args: Any, **kwargs: Any) -> bool:
        nonlocal calls
        calls += 1
        result = await original(*args, **kwargs)  # the server ran the script...
        if calls == 1:
            await eventually(lambda: len(runs) >= 2, 5, "the next attempt")
            raise ConnectionError("connection reset before the reply")  # ...the reply is lost
        return result

    broker.retry = reply_lost  # type: ignore[method-assign]
    await once.enqueue()
    async with app.worker(concurrency=4) as worker:
        await eventually(lambda: worker.stats.processed >= 1 and calls >= 2, 5, "the re-sent step")
        await asyncio.sleep(0.3)
    assert runs == [1, 2], "the next attempt ran twice"
    assert (await broker.stats()).get("retried") == 1
    assert await app.broker.depth() == aqw.QueueDepth(0, 0, 0, 0)


async def test_a_lost_reply_to_the_dead_letter_step_writes_one_entry(
    redis_backend: Backend,
) -> None:
    app = redis_backend.app()

    @app.task(name="refuse")
    async def refuse() -> None:
        raise aqw.Reject("no")

    broker = app.broker
    assert isinstance(broker, RedisBroker)
    original = broker.dead_letter
    calls = 0

    async def reply_lost(*args: Any, **kwargs: Any) -> str | None:
        nonlocal calls
        calls += 1
        result = await original(*args, **kwargs)
        if calls == 1:
            raise ConnectionError("connection reset before the reply")
        return result

    broker.dead_letter = reply_lost  # type: ignore[method-assign]
    await refuse.enqueue()
    async with app.worker():
        await eventually(lambda: calls >= 2, 5, "the re-sent step")
        await asyncio.sleep(0.1)
    assert await app.dlq.count() == 1, "one job, two DLQ entries"
    assert (await broker.stats()).get("dead") == 1
    assert await app.broker.depth() == aqw.QueueDepth(0, 0, 0, 1)


# -- a worker that stops while a delivery is on its way ------------------------------------------


@pytest.mark.redis
async def test_a_stopping_worker_leaves_no_fetched_entry_behind(
    queue_name: str, raw: Redis
) -> None:
    keys = QueueKeys(queue_name)
    # the embedding app (e.g. a web app's lifespan) enqueues while its worker stops; the
    # worker is started and stopped again on the same app (a supervisor restarting it)
    app = aqw.App(RedisBroker(REDIS_URL, queue_name))

    @app.task(name="t")
    async def t(n: int) -> None:
        pass

    stranded: list[dict[str, Any]] = []
    try:
        for n in range(20):
            worker = app.worker()
            await worker.start()
            await asyncio.sleep(0.05)  # the fetch is blocked in XREADGROUP
            stopping = asyncio.ensure_future(worker.stop())
            await asyncio.sleep(0)
            await t.enqueue(n)
            await stopping
            pending = await raw.xpending_range(keys.stream, GROUP, "-", "+", 10)
            if pending:
                stranded = [
                    {k: (v.decode() if isinstance(v, bytes) else v) for k, v in p.items()}
                    for p in pending
                ]
                break
            await raw.delete(keys.stream)  # the entry waits unread: start the next round clean
    finally:
        await app.close()
    assert stranded == [], f"left pending by a stopped worker: {json.dumps(stranded)}"
