"""Idempotency keys and completion records on the memory broker, fakeredis and the real Redis.

An idempotency key makes an enqueue happen once while its record lives, and a finished keyed
job is never run again while its completion record lives, however often it is redelivered.
Counts are exact. The real Redis not answering is a failure, never a skip; each test works in
its own queue whose ``aqw:{queue}:*`` keys are deleted at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from conftest import Backend

import aqw
from tests._helpers import eventually, ttl_agrees
from tests.testkit._clocks import clock_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(backend: Backend) -> Backend:
    """Apps on one backend (memory, fakeredis, the real Redis) and one queue; ``raw`` is a
    plain client on the same data (None for the memory broker)."""
    return backend


def stream(env: Backend) -> str:
    return f"aqw:{{{env.queue}}}:stream"


async def idle(app: aqw.App) -> bool:
    """Nothing waiting, running, or delayed."""
    d = await app.broker.depth()
    return d.waiting == 0 and d.in_flight == 0 and d.delayed == 0


def register(app: aqw.App, runs: Counter[str], sleep: float = 0.0) -> aqw.Task[None]:
    @app.task(name="once")
    async def once(n: int, ctx: aqw.Context) -> None:
        runs[ctx.job.id] += 1
        if sleep:
            await asyncio.sleep(sleep)

    return once


# -- enqueue ---------------------------------------------------------------------------------------


async def test_fifty_concurrent_enqueues_with_one_key_make_one_job(env: Backend) -> None:
    runs: Counter[str] = Counter()
    producers = [env.app() for _ in range(5)]
    tasks = [register(app, runs) for app in producers]
    results = await asyncio.gather(
        *(task.enqueue(i, key="order:42") for i in range(10) for task in tasks)
    )
    assert len(results) == 50
    firsts = [r for r in results if not r.duplicate]
    assert len(firsts) == 1
    assert {str(r) for r in results} == {str(firsts[0])}
    assert all(isinstance(r, aqw.Enqueued) for r in results)
    depth = await producers[0].broker.depth()
    assert (depth.waiting, depth.in_flight, depth.delayed) == (1, 0, 0)

    worker = producers[0].worker(burst=True)
    await asyncio.wait_for(worker.run(), 20)
    assert runs == Counter({str(firsts[0]): 1})
    assert worker.stats.processed == 1 and worker.stats.duplicates_skipped == 0
    # within the key's TTL the key still names the same (finished) job
    again = await tasks[0].enqueue(7, key="order:42")
    assert again.duplicate and again == firsts[0]
    assert await idle(producers[0])


async def test_different_keys_and_no_key_are_not_deduplicated(env: Backend) -> None:
    runs: Counter[str] = Counter()
    app = env.app()
    task = register(app, runs)
    keyed = await asyncio.gather(*(task.enqueue(i, key=f"k{i % 3}") for i in range(9)))
    plain = await asyncio.gather(*(task.enqueue(i) for i in range(3)))
    assert len({str(r) for r in keyed}) == 3
    assert sum(not r.duplicate for r in keyed) == 3
    assert len(set(plain)) == 3 and not any(r.duplicate for r in plain)
    assert (await app.broker.depth()).waiting == 6


async def test_delay_with_a_key_goes_to_the_delayed_set_once(env: Backend) -> None:
    runs: Counter[str] = Counter()
    app = env.app()
    task = register(app, runs)
    delay = 0.5
    enqueued_at = time.monotonic()
    results = await asyncio.gather(*(task.enqueue(i, key="later", delay=delay) for i in range(20)))
    firsts = [r for r in results if not r.duplicate]
    assert len(firsts) == 1 and {str(r) for r in results} == {str(firsts[0])}
    depth = await app.broker.depth()
    assert (depth.waiting, depth.in_flight, depth.delayed) == (0, 0, 1)
    if env.raw is not None:
        assert await env.raw.zcard(f"aqw:{{{env.queue}}}:delayed") == 1
        assert await env.raw.xlen(stream(env)) == 0
    # a second producer during the delay is a duplicate too, and adds nothing
    late = await task.enqueue(99, key="later", delay=0.1)
    assert late.duplicate and late == firsts[0]
    assert (await app.broker.depth()).delayed == 1

    async with app.worker() as worker:
        await eventually(lambda: worker.stats.processed == 1, 10, "the delayed job to run")
    assert time.monotonic() - enqueued_at >= delay  # it waited for its due time
    assert runs == Counter({str(firsts[0]): 1})
    assert await idle(app)


# -- redelivery of a finished job ----------------------------------------------------------------


def skipped(worker: aqw.Worker) -> int:
    """Copies of a finished job the worker did not run: refused at their start (the record
    had ended) or skipped after it (the completion record exists)."""
    return worker.stats.duplicates_skipped + worker.stats.stale_starts


async def test_a_finished_keyed_job_redelivered_ten_times_runs_once(env: Backend) -> None:
    runs: Counter[str] = Counter()
    seen: list[aqw.Job] = []
    app = env.app(lease_ttl=0.5)

    @app.task(name="once")
    async def once(n: int, ctx: aqw.Context) -> None:
        runs[ctx.job.id] += 1
        seen.append(ctx.job)

    job_id = await once.enqueue(1, key="pay:1")
    original: bytes | None = None
    if env.raw is not None:
        entries: Any = await env.raw.xrange(stream(env))
        assert len(entries) == 1
        original = entries[0][1][b"j"]

    async with app.worker(concurrency=4) as worker:
        await eventually(lambda: worker.stats.processed == 1, 10, "the first run")
        assert await idle(app)
        if env.raw is not None:
            assert original is not None
            assert await env.raw.get(f"aqw:{{{env.queue}}}:done:pay:1") == job_id.encode()
            pipe = env.raw.pipeline(transaction=False)
            for _ in range(10):  # the same envelope bytes, ten more times
                pipe.xadd(stream(env), {"j": original})
            await pipe.execute()
        else:
            await app.broker.publish([seen[0]] * 10)  # the same Job object, ten more times
        # A copy is skipped at its start (its record has ended: a stale start, taking
        # nothing) or, when it starts before the end is written, by the completion record.
        await eventually(lambda: skipped(worker) == 10, 15, "ten redeliveries to be skipped")
        await eventually(lambda: idle(app), 10, "every copy to be acknowledged")
    assert runs == Counter({str(job_id): 1})
    assert worker.stats.processed == 1
    assert skipped(worker) == 10
    assert worker.stats.failed == 0 and worker.stats.dead == 0
    if env.raw is not None:
        assert await env.raw.xlen(stream(env)) == 0


async def test_a_copy_delivered_while_the_job_runs_is_not_run_twice(env: Backend) -> None:
    runs: Counter[str] = Counter()
    seen: list[aqw.Job] = []
    # A TTL a loop stall of a loaded machine does not outlast (0.5 s once lost the lease
    # to a 0.5 s stall on fakeredis, and the job rightly ran again).
    app = env.app(lease_ttl=2.0)

    @app.task(name="once")
    async def once(n: int, ctx: aqw.Context) -> None:
        runs[ctx.job.id] += 1
        seen.append(ctx.job)
        await asyncio.sleep(2.2)  # longer than the TTL: the lease is renewed meanwhile

    job_id = await once.enqueue(1, key="slow:1")
    async with app.worker(concurrency=8) as worker:
        await eventually(lambda: bool(seen), 10, "the job to start")
        await app.broker.publish([seen[0]] * 3)  # copies arrive while it runs
        await eventually(lambda: skipped(worker) == 3, 15, "three copies skipped")
        await eventually(lambda: idle(app), 10, "every copy to be acknowledged")
    assert runs == Counter({str(job_id): 1})
    assert worker.stats.processed == 1


# -- expiry ----------------------------------------------------------------------------------


async def test_the_key_expiring_allows_a_new_job(env: Backend) -> None:
    runs: Counter[str] = Counter()
    ttl = 1.0  # long enough for the duplicate below to come within it on a loaded machine
    app = env.app(idempotency_ttl=ttl)
    task = register(app, runs)
    enqueued_at = time.monotonic()
    first = await task.enqueue(1, key="nightly")
    assert not first.duplicate
    assert (await task.enqueue(2, key="nightly")).duplicate
    if env.raw is not None:
        key = f"aqw:{{{env.queue}}}:key:nightly"
        assert ttl_agrees(await env.raw.pttl(key), ttl * 1000, since=enqueued_at)
    async with clock_for(env), app.worker() as worker:  # memory: the TTL passes at once
        await eventually(lambda: worker.stats.processed == 1, 10, "the first job")
        # both the enqueue record and the completion record expire
        await asyncio.sleep(ttl + 0.1)
        assert not await app.broker.is_completed(aqw.Job(task="once", key="nightly"))
        second = await task.enqueue(3, key="nightly")
        assert not second.duplicate and second != first
        assert (await task.enqueue(4, key="nightly")) == second  # a new record, a new TTL
        await eventually(lambda: worker.stats.processed == 2, 10, "the new job")
        assert await idle(app)
    assert runs == Counter({str(first): 1, str(second): 1})
    assert worker.stats.duplicates_skipped == 0


async def test_a_key_accepted_as_new_is_never_silently_skipped(env: Backend) -> None:
    runs: Counter[str] = Counter()
    app = env.app(idempotency_ttl=1.0)
    task = register(app, runs, sleep=0.7)
    first = await task.enqueue(1, key="report")
    async with app.worker() as worker:
        await eventually(lambda: worker.stats.processed == 1, 10, "the first job")
        await asyncio.sleep(max(0.0, 1.15 - 0.7))  # enqueue record gone, completion record not
        second = await task.enqueue(2, key="report")
        await eventually(lambda: idle(app), 10, "the second enqueue to settle")
    # either the key still counts as taken, or the job it created runs
    assert second.duplicate or runs[str(second)] == 1, (first, second, runs, worker.stats)
