"""Task timeouts are stops: a handler past its timeout is cancelled until it exits, never
resumed, and never acknowledged as done, even when it awaits Redis in a tight loop (where
redis-py can swallow a cancellation), catches ``CancelledError`` and goes on, or returns
normally after its deadline. Such a job is retried per its policy, then dead-lettered with
``JobTimeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from tests._helpers import depth, eventually

pytestmark = pytest.mark.timeout(60)

JOBS = 200
#: INCRs per run of the bounded handler: far more than fit in its 20 ms timeout (one
#: round trip to a local Redis, or a call into fakeredis, takes ~50 us or more).
LOOP = 2000


def fast(max_retries: int) -> aqw.RetryPolicy:
    return aqw.RetryPolicy(max_retries=max_retries, base=0.01, cap=0.02)


async def assert_drained(backend: Backend, app: aqw.App, dead: int) -> None:
    assert await depth(app) == (0, 0, 0, dead)
    if backend.raw is not None:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        assert await backend.raw.xlen(broker.keys.stream) == 0
        assert int((await backend.raw.xpending(broker.keys.stream, "aqw"))["pending"]) == 0
        assert await backend.raw.zcard(broker.keys.delayed) == 0


async def check_dead_lettered(
    app: aqw.App, worker: aqw.Worker, jobs: int, runs: Counter[int], max_retries: int
) -> None:
    dead = await app.dlq.list(limit=jobs + 10)
    assert len(dead) == jobs
    kinds = Counter(d.error_type for d in dead)
    assert kinds == Counter({"JobTimeout": jobs}), kinds
    assert all(d.attempts == max_retries + 1 for d in dead), Counter(d.attempts for d in dead)
    assert all(d.error for d in dead)
    # Never more runs than the bound. Fewer is right too: an attempt whose 20 ms passed
    # before its handler's first statement (a garbage collection or a busy machine between
    # the deadline being set and the first resume) is stopped without running a statement.
    assert set(runs) <= set(range(jobs)) and max(runs.values()) <= max_retries + 1, (
        f"a job ran more times than its retry bound allows: {Counter(runs.values())}"
    )
    assert sum(runs.values()) >= jobs * (max_retries + 1) // 2, Counter(runs.values())
    assert worker.stats.processed == 0, worker.stats
    assert (await app.broker.stats()).get("processed", 0) == 0


@pytest.mark.parametrize("max_retries", [0, 1])
@pytest.mark.parametrize("shape", ["bounded", "forever"])
async def test_200_jobs_awaiting_redis_past_a_20ms_timeout_are_never_acked(
    redis_backend: Backend, shape: str, max_retries: int
) -> None:
    backend = redis_backend
    r = backend.client()
    tag = f"aqw:{{{backend.queue}}}"
    counter, finished_key = f"{tag}:incr", f"{tag}:finished"
    app = backend.app()
    runs: Counter[int] = Counter()
    finished: list[int] = []
    escape = False

    @app.task(name="spin", timeout=0.02, retry=fast(max_retries), lease_ttl=5.0)
    async def spin(n: int) -> None:
        runs[n] += 1
        if shape == "bounded":
            for _ in range(LOOP):
                await r.incr(counter)
        else:
            while not escape:  # only so that a failing run ends: the test sets it last
                await r.incr(counter)
        finished.append(n)
        await r.rpush(finished_key, n)

    await spin.enqueue_many(list(range(JOBS)))
    # One warm connection per slot: a command cancelled by the timeout drops its connection,
    # and 50 handlers opening fresh ones at once could all spend their 20 ms connecting, wave
    # after wave, so that no INCR ever completed and the checks below would prove nothing.
    await asyncio.gather(*(r.ping() for _ in range(50)))
    worker = app.worker(concurrency=50)
    await worker.start()
    try:
        with contextlib.suppress(AssertionError):  # checked below, with the reason
            await eventually(lambda: worker.stats.dead >= JOBS, 10, "every job dead-lettered")
        await asyncio.sleep(0.2)
        # every handler has stopped: the counter no longer moves
        before = int(await r.get(counter) or 0)
        await asyncio.sleep(0.3)
        after = int(await r.get(counter) or 0)
        ran_to_the_end = list(finished)
        in_flight = worker.in_flight
    finally:
        escape = True
        await asyncio.wait_for(worker.stop(), 20)
    assert before > 0, "no handler ever ran"
    assert ran_to_the_end == [], f"{len(ran_to_the_end)} timed-out handlers ran to their end"
    assert after == before, (
        f"{in_flight} handlers still running after their timeout: INCRs {before} -> {after}"
    )
    assert await r.llen(finished_key) == 0
    await check_dead_lettered(app, worker, JOBS, runs, max_retries)
    assert worker.stats.retried == JOBS * max_retries
    await assert_drained(backend, app, JOBS)


async def test_a_handler_that_catches_the_cancellation_and_goes_on_is_still_stopped(
    backend: Backend,
) -> None:
    app = backend.app()
    runs: Counter[int] = Counter()
    caught: list[int] = []
    went_on: list[int] = []

    @app.task(name="stubborn", timeout=0.1, retry=fast(1))
    async def stubborn(n: int) -> None:
        runs[n] += 1
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            caught.append(n)  # ...and carries on as if nothing happened
        await asyncio.sleep(0)
        went_on.append(n)
        await asyncio.sleep(0.01)
        went_on.append(n)

    await stubborn.enqueue_many(list(range(10)))
    async with app.worker(concurrency=10) as worker:
        await eventually(lambda: worker.stats.dead >= 10, 20, "10 jobs dead-lettered")
        await asyncio.sleep(0.2)
    # The first stop is a CancelledError (caught here); the next resume throws
    # aqw.HandlerStopped, which `except CancelledError` does not catch.
    assert sorted(caught) == sorted(list(range(10)) * 2), caught
    assert went_on == [], "a handler ran statements after its timeout"
    await check_dead_lettered(app, worker, 10, runs, 1)
    await assert_drained(backend, app, 10)


async def test_a_handler_that_swallows_every_cancellation_then_returns_is_not_acked(
    backend: Backend,
) -> None:
    app = backend.app()
    runs: Counter[int] = Counter()
    returned: list[int] = []
    swallowed: list[int] = []

    @app.task(name="persistent", timeout=0.05, retry=fast(1))
    async def persistent(n: int) -> None:
        runs[n] += 1
        count = 0
        while count < 20:
            try:
                await asyncio.sleep(0.005)
            except BaseException:  # swallows aqw's stop too (and cancellations)
                count += 1
        swallowed.append(count)
        returned.append(n)  # a normal return, well after the deadline

    await persistent.enqueue_many(list(range(10)))
    async with app.worker(concurrency=10) as worker:
        await eventually(lambda: worker.stats.dead >= 10, 20, "10 jobs dead-lettered")
        # each run goes on past its stop for 20 more sleeps before it returns: wait for the
        # returns (a loaded machine can take longer than any fixed pause)
        await eventually(
            lambda: len(returned) == 20,
            20,
            "the handlers did not return normally: nothing tested",
        )
    await check_dead_lettered(app, worker, 10, runs, 1)
    await assert_drained(backend, app, 10)


@pytest.mark.parametrize("how", ["blocking", "awaits-then-blocks"])
async def test_a_handler_that_returns_normally_after_its_deadline_is_not_acked(
    backend: Backend, how: str
) -> None:
    app = backend.app()
    runs: Counter[int] = Counter()
    returned: list[int] = []

    @app.task(name="overrun", timeout=0.05, retry=fast(1))
    async def overrun(n: int) -> Any:
        runs[n] += 1
        if how == "awaits-then-blocks":
            await asyncio.sleep(0.01)
        time.sleep(0.1)  # noqa: ASYNC251 - nothing after it can be stopped, only not acked
        returned.append(n)
        return n

    await overrun.enqueue_many(list(range(5)))
    # one at a time: a job blocking the loop must not push another past its own deadline
    async with app.worker(concurrency=1) as worker:
        await eventually(lambda: worker.stats.dead >= 5, 20, "5 jobs dead-lettered")
        await asyncio.sleep(0.2)
    assert len(returned) == 10  # each ran to its return, twice (one retry)
    await check_dead_lettered(app, worker, 5, runs, 1)
    await assert_drained(backend, app, 5)


async def test_a_handler_looping_on_asyncio_wait_for_is_stopped_at_its_timeout() -> None:
    """The pattern inside redis-py's send path, without Redis: on Python 3.11
    ``asyncio.wait_for`` returns the inner result when a cancellation lands as the inner
    awaitable completes, so a stop thrown in at that resume is swallowed."""
    app = aqw.App(MemoryBroker(f"t-waitfor-{time.monotonic_ns()}"))
    loops: list[int] = []
    ran_to_the_end: list[int] = []
    escape = False

    async def quick() -> int:
        return 1

    @app.task(name="waiter", timeout=0.05, retry=fast(0))
    async def waiter(n: int) -> None:
        count = 0
        while not escape:  # only so that a failing run ends: the test sets it last
            await asyncio.wait_for(quick(), 5)
            count += 1
            loops[n] = count
        ran_to_the_end.append(n)

    loops.extend([0] * 5)
    await waiter.enqueue_many(list(range(5)))
    worker = app.worker(concurrency=5)
    await worker.start()
    try:
        with contextlib.suppress(AssertionError):
            await eventually(lambda: worker.stats.dead >= 5, 5, "5 jobs dead-lettered")
        before = list(loops)
        await asyncio.sleep(0.3)
        after = list(loops)
        finished = list(ran_to_the_end)
        dead = worker.stats.dead
    finally:
        escape = True
        await asyncio.wait_for(worker.stop(), 20)
        await app.close()
    assert finished == [], f"{len(finished)} handlers ran to their end past a 0.05 s timeout"
    assert after == before, f"handlers still looping after their timeout: {before} -> {after}"
    assert dead == 5
    assert worker.stats.processed == 0
