"""Retries: the backoff policy's distribution, and the retry bound, ``no_retry``, ``Retry``,
``Reject`` and ``timeout`` as the worker applies them, on the memory broker, fakeredis and the
real Redis.

Counts are exact: one run too many or too few, a second DLQ entry, an ack of a timed-out job,
all fail.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Backend
from pydantic import BaseModel, ValidationError

import aqw
from tests._helpers import assert_stream_empty, depth, eventually

pytestmark = pytest.mark.timeout(30)

FAST = aqw.RetryPolicy(max_retries=3, base=0.01, cap=0.02)


# -- helpers ------------------------------------------------------------------------------------


async def run_until(
    app: aqw.App,
    done: Callable[[aqw.Worker], bool],
    what: str,
    *,
    within: float = 10.0,
    settle: float = 0.3,
    **options: Any,
) -> aqw.Worker:
    """Run a worker until ``done(worker)``, then ``settle`` seconds more (time for a wrong
    extra run to show up), and stop it."""
    worker = app.worker(**options)
    async with worker:
        await eventually(lambda: done(worker), within, what)
        await asyncio.sleep(settle)
    return worker


# -- the policy: full-jitter exponential backoff --------------------------------------------------

CHI2_99_9 = {
    9: 27.877,
    19: 43.820,
}  # chi-square critical values at p = 0.001, by degrees of freedom


@pytest.mark.parametrize(
    ("base", "cap"), [(1.0, 300.0), (0.05, 2.0), (0.5, 0.5)], ids=["default", "small", "flat"]
)
def test_full_jitter_delays_are_uniform_below_the_ceiling(base: float, cap: float) -> None:
    policy = aqw.RetryPolicy(max_retries=20, base=base, cap=cap)
    rng = random.Random(20240601)
    samples = 4000
    buckets = 20
    for attempt in range(1, 16):
        ceiling = min(cap, base * 2 ** (attempt - 1))
        assert policy.ceiling(attempt) == pytest.approx(ceiling)
        delays = [policy.delay(attempt, rng) for _ in range(samples)]
        assert all(0.0 <= d <= ceiling for d in delays), f"attempt {attempt}: out of range"
        # mean of U(0, c) is c/2 with standard error c / sqrt(12 n): allow 4.5 standard errors
        mean = sum(delays) / samples
        tolerance = 4.5 * ceiling / math.sqrt(12 * samples)
        assert abs(mean - ceiling / 2) < tolerance, (attempt, mean, ceiling)
        # the whole range is used, not a narrow band ("equal jitter" would start at c/2)
        assert min(delays) < 0.01 * ceiling and max(delays) > 0.99 * ceiling, attempt
        # chi-square goodness of fit against 20 equal buckets
        counts = [0] * buckets
        for d in delays:
            counts[min(int(d / ceiling * buckets), buckets - 1)] += 1
        expected = samples / buckets
        chi2 = sum((c - expected) ** 2 / expected for c in counts)
        assert chi2 < CHI2_99_9[buckets - 1], (attempt, chi2, counts)


def test_the_same_seed_gives_the_same_delays_and_other_seeds_differ() -> None:
    policy = aqw.RetryPolicy(base=1.0, cap=60.0)
    first = [policy.delay(n, random.Random(7)) for n in range(1, 8)]
    again = [policy.delay(n, random.Random(7)) for n in range(1, 8)]
    other = [policy.delay(n, random.Random(8)) for n in range(1, 8)]
    assert first == again
    assert first != other


def test_without_jitter_the_delay_is_exactly_the_ceiling() -> None:
    policy = aqw.RetryPolicy(max_retries=30, base=0.25, cap=40.0, jitter=False)
    rng = random.Random(1)
    expected = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 40.0, 40.0, 40.0]
    assert [policy.delay(n, rng) for n in range(1, 12)] == expected
    assert [policy.delay(n) for n in range(1, 12)] == expected  # no rng: still no randomness


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    policy = aqw.RetryPolicy(base=0.1, cap=120.0, jitter=False)
    for attempt in (60, 63, 64, 1000, 10**9):
        assert policy.delay(attempt) == 120.0
    assert policy.ceiling(0) == 0.1  # attempt < 1 is treated as the first


def test_retries_left_and_no_retry_classification() -> None:
    class Permanent(Exception):
        pass

    class VeryPermanent(Permanent):
        pass

    policy = aqw.RetryPolicy(max_retries=2, no_retry=(Permanent, KeyError))
    assert [policy.retries_left(n) for n in (1, 2, 3, 4)] == [True, True, False, False]
    assert not aqw.RetryPolicy(max_retries=0).retries_left(1)
    assert policy.is_retryable(ValueError())
    assert not policy.is_retryable(Permanent())
    assert not policy.is_retryable(VeryPermanent())  # subclasses too
    assert not policy.is_retryable(KeyError("k"))
    copy = policy.with_max_retries(7)
    assert (copy.max_retries, copy.no_retry, copy.base, copy.cap) == (
        7,
        policy.no_retry,
        1.0,
        300.0,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retries": -1},
        {"base": 0.0},
        {"base": -1.0},
        {"base": 2.0, "cap": 1.0},
        {"cap": 0.5},  # below the default base of 1.0
    ],
)
def test_bad_policy_arguments_raise_config_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(aqw.ConfigError):
        aqw.RetryPolicy(**kwargs)


def test_bad_retry_bounds_on_tasks_and_retry_delays_raise_config_error() -> None:
    app = aqw.App("memory://")
    with pytest.raises(aqw.ConfigError):

        @app.task(max_retries=-1)
        async def never() -> None:
            pass

    assert "never" not in app.tasks
    with pytest.raises(aqw.ConfigError):
        aqw.Retry(delay=-0.1)
    assert aqw.Retry(delay=0).delay == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: aqw.RetryPolicy(base=math.nan),
        lambda: aqw.RetryPolicy(cap=math.nan),
        lambda: aqw.RetryPolicy(cap=math.inf, base=math.inf),
        lambda: aqw.Retry(delay=math.nan),
        lambda: aqw.Retry(delay=math.inf),
    ],
    ids=["base-nan", "cap-nan", "inf", "retry-delay-nan", "retry-delay-inf"],
)
def test_non_finite_numbers_raise_config_error(make: Callable[[], object]) -> None:
    with pytest.raises(aqw.ConfigError):
        make()


# -- the worker applies the policy ----------------------------------------------------------------


@pytest.mark.parametrize("max_retries", [0, 3])
async def test_a_job_failing_forever_runs_max_retries_plus_one_times(
    backend: Backend, max_retries: int
) -> None:
    app = backend.app(retry=FAST)
    attempts: list[int] = []
    began = time.time()

    @app.task(name="doomed", max_retries=max_retries)
    async def doomed(n: int, ctx: aqw.Context) -> None:
        attempts.append(ctx.attempt)
        raise ValueError(f"boom {n}")

    job_id = await doomed.enqueue(11)
    worker = await run_until(app, lambda w: w.stats.dead >= 1, "the dead letter", settle=0.4)
    assert attempts == list(range(1, max_retries + 2))
    s = worker.stats
    assert (s.failed, s.retried, s.dead, s.processed) == (max_retries + 1, max_retries, 1, 0)
    dead = await app.dlq.list()
    assert len(dead) == 1
    d = dead[0]
    assert (d.job_id, d.task, d.error_type, d.attempts) == (
        job_id,
        "doomed",
        "ValueError",
        max_retries + 1,
    )
    assert d.error == "ValueError: boom 11"
    assert "raise ValueError" in d.traceback
    assert d.worker == worker.name
    assert began <= d.first_failed_at <= d.last_failed_at <= time.time()
    if max_retries:
        assert d.first_failed_at < d.last_failed_at  # the first failure is remembered
    assert d.job is not None and (d.job.payload, d.job.attempt) == (11, max_retries + 1)
    stats = await app.broker.stats()
    assert stats.get("retried", 0) == max_retries
    assert stats.get("dead") == 1
    assert stats.get("processed", 0) == 0
    assert await depth(app) == (0, 0, 0, 1)
    await assert_stream_empty(backend, app, delayed=True)


async def test_the_worker_waits_the_policy_delay_between_runs(backend: Backend) -> None:
    policy = aqw.RetryPolicy(max_retries=3, base=0.1, cap=0.3, jitter=False)
    app = backend.app(retry=policy)
    starts: list[float] = []

    @app.task(name="slowly")
    async def slowly() -> None:
        starts.append(time.monotonic())
        raise ConnectionError("down")

    await slowly.enqueue()
    await run_until(app, lambda w: w.stats.dead >= 1, "the dead letter", settle=0.1)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 3
    for gap, delay in zip(gaps, [0.1, 0.2, 0.3], strict=True):
        assert delay <= gap < delay + 0.15, gaps


async def test_no_retry_errors_and_validation_errors_go_straight_to_the_dlq(
    backend: Backend,
) -> None:
    class Permanent(Exception):
        pass

    class Forbidden(Permanent):
        pass

    class Row(BaseModel):
        n: int

    app = backend.app(
        retry=aqw.RetryPolicy(max_retries=5, base=0.01, cap=0.02, no_retry=(Permanent,))
    )
    runs: list[str] = []

    @app.task(name="guarded")
    async def guarded(kind: str) -> None:
        runs.append(kind)
        if kind == "forbidden":
            raise Forbidden("no access")
        if kind == "invalid":
            Row.model_validate({"n": "not a number"})  # a ValidationError raised by the handler
        raise TimeoutError("transient")  # retried 5 times

    await guarded.enqueue("forbidden")
    await guarded.enqueue("invalid")
    await guarded.enqueue("transient")
    worker = await run_until(app, lambda w: w.stats.dead >= 3, "three dead letters")
    assert sorted(runs) == ["forbidden", "invalid"] + ["transient"] * 6
    assert worker.stats.retried == 5
    dead = {d.job.payload: d for d in await app.dlq.list() if d.job is not None}
    assert sorted(dead) == ["forbidden", "invalid", "transient"]
    assert (dead["forbidden"].error_type, dead["forbidden"].attempts) == ("Forbidden", 1)
    assert dead["forbidden"].error == "Forbidden: no access"
    assert (dead["invalid"].error_type, dead["invalid"].attempts) == ("ValidationError", 1)
    assert "n: Input should be a valid integer" in dead["invalid"].error
    assert (dead["transient"].error_type, dead["transient"].attempts) == ("TimeoutError", 6)
    assert await depth(app) == (0, 0, 0, 3)


async def test_retry_with_a_delay_reruns_after_the_delay(backend: Backend) -> None:
    app = backend.app(retry=aqw.RetryPolicy(max_retries=3, base=30.0, cap=30.0))
    starts: list[float] = []

    @app.task(name="later")
    async def later(ctx: aqw.Context) -> None:
        starts.append(time.monotonic())
        if ctx.attempt == 1:
            raise aqw.Retry(delay=0.2, reason="not yet")  # overrides the 30 s policy delay

    await later.enqueue()
    worker = await run_until(app, lambda w: w.stats.processed >= 1, "the second run")
    assert len(starts) == 2
    assert 0.2 <= starts[1] - starts[0] < 0.35, starts[1] - starts[0]
    assert (worker.stats.retried, worker.stats.processed, worker.stats.dead) == (1, 1, 0)
    assert await depth(app) == (0, 0, 0, 0)
    await assert_stream_empty(backend, app, delayed=True)


async def test_retry_counts_against_max_retries(backend: Backend) -> None:
    app = backend.app(retry=FAST)
    attempts: list[int] = []

    @app.task(name="again", max_retries=2)
    async def again(ctx: aqw.Context) -> None:
        attempts.append(ctx.attempt)
        raise aqw.Retry(delay=0.01, reason="still waiting for the bank")

    await again.enqueue()
    worker = await run_until(app, lambda w: w.stats.dead >= 1, "the dead letter")
    assert attempts == [1, 2, 3]
    assert (worker.stats.retried, worker.stats.dead) == (2, 1)
    dead = await app.dlq.list()
    assert [(d.error_type, d.attempts) for d in dead] == [("Retry", 3)]
    assert "still waiting for the bank" in dead[0].error


async def test_reject_dead_letters_at_once_with_the_reason(backend: Backend) -> None:
    app = backend.app(retry=FAST)
    runs = 0

    @app.task(name="refuse", max_retries=5)
    async def refuse(n: int) -> None:
        nonlocal runs
        runs += 1
        raise aqw.Reject(f"order {n} was cancelled by the customer")

    job_id = await refuse.enqueue(42)
    worker = await run_until(app, lambda w: w.stats.dead >= 1, "the dead letter")
    assert runs == 1
    assert (worker.stats.retried, worker.stats.dead, worker.stats.processed) == (0, 1, 0)
    [d] = await app.dlq.list()
    assert (d.job_id, d.error_type, d.attempts) == (job_id, "Reject", 1)
    assert d.error == "Reject: order 42 was cancelled by the customer"
    assert d.first_failed_at == d.last_failed_at
    assert await depth(app) == (0, 0, 0, 1)


async def test_a_timed_out_handler_is_retried_and_never_acked(backend: Backend) -> None:
    app = backend.app(retry=FAST)
    runs = 0
    finished = 0

    @app.task(name="stuck", timeout=0.1, max_retries=2)
    async def stuck() -> None:
        nonlocal runs, finished
        runs += 1
        await asyncio.sleep(3600)  # only the timeout ends it: else no dead letter in time
        finished += 1  # never reached: the timeout cancels the handler

    await stuck.enqueue()
    worker = await run_until(app, lambda w: w.stats.dead >= 1, "the dead letter")
    assert (runs, finished) == (3, 0)
    s = worker.stats
    assert (s.processed, s.failed, s.retried, s.dead) == (0, 3, 2, 1)
    assert (await app.broker.stats()).get("processed", 0) == 0
    [d] = await app.dlq.list()
    assert (d.error_type, d.attempts) == ("JobTimeout", 3)
    assert "ran longer than its timeout of 0.1s" in d.error
    assert await depth(app) == (0, 0, 0, 1)
    await assert_stream_empty(backend, app, delayed=True)


async def test_ctx_attempt_counts_1_2_3_and_the_job_keeps_its_id(backend: Backend) -> None:
    app = backend.app(retry=FAST)
    seen: list[tuple[str, int, int]] = []

    @app.task(name="flaky", max_retries=5)
    async def flaky(n: int, ctx: aqw.Context) -> None:
        seen.append((ctx.job_id, ctx.attempt, n))
        if ctx.attempt < 3:
            raise ConnectionError("try again")

    job_id = await flaky.enqueue(5)
    worker = await run_until(app, lambda w: w.stats.processed >= 1, "the third run")
    assert seen == [(job_id, 1, 5), (job_id, 2, 5), (job_id, 3, 5)]
    assert (worker.stats.retried, worker.stats.processed, worker.stats.dead) == (2, 1, 0)
    stats = await app.broker.stats()
    assert (stats.get("retried"), stats.get("processed"), stats.get("dead", 0)) == (2, 1, 0)
    assert await depth(app) == (0, 0, 0, 0)
    await assert_stream_empty(backend, app, delayed=True)


async def test_a_validation_error_at_enqueue_is_not_a_retry(backend: Backend) -> None:
    """A bad payload never reaches the queue, so it can never be retried."""
    app = backend.app(retry=FAST)

    @app.task(name="typed")
    async def typed(n: int) -> None:
        raise AssertionError("never runs")

    with pytest.raises(ValidationError):
        await typed.enqueue("seven")
    assert await depth(app) == (0, 0, 0, 0)


async def test_burst_waits_for_its_own_retry_when_counts_read_empty() -> None:
    """A broker whose counts are approximate (SQS reads them one by one) can report an empty
    queue as a retried message turns visible; a burst worker still runs that retry."""
    app = aqw.App(
        "memory://", retry=aqw.RetryPolicy(max_retries=2, base=1.5, cap=1.5, jitter=False)
    )
    runs: list[int] = []

    @app.task
    async def flaky(n: int, ctx: aqw.Context) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("upstream unavailable")

    broker = app.broker

    async def nothing_counted() -> aqw.QueueDepth:
        return aqw.QueueDepth(waiting=0, in_flight=0, delayed=0, dead=0)

    broker.depth = nothing_counted  # type: ignore[method-assign]
    broker.depth_lag = 2.0  # as SQS's: its counts may miss a retry as it turns visible
    await flaky.enqueue(1)
    worker = app.worker(burst=True, concurrency=2)
    await asyncio.wait_for(worker.run(), 10)
    assert runs == [1, 2]
    assert (worker.stats.processed, worker.stats.retried) == (1, 1)
    await app.close()


@pytest.mark.parametrize("lag", [0.0, 3600.0])
async def test_a_burst_ends_after_a_retry_once_its_brokers_depth_lag_has_passed(
    lag: float,
) -> None:
    """Exact counts (``depth_lag`` 0: memory, Redis, PostgreSQL) are believed as soon as the
    retry came due and ran; a broker whose counts lag holds the burst that long past it."""
    app = aqw.App("memory://", retry=aqw.RetryPolicy(max_retries=2, base=0.05, cap=0.05))
    runs: list[int] = []

    @app.task
    async def flaky(n: int, ctx: aqw.Context) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("upstream unavailable")

    app.broker.depth_lag = lag
    await flaky.enqueue(1)
    worker = app.worker(burst=True)
    run = asyncio.create_task(worker.run())
    try:
        if lag == 0.0:
            await asyncio.wait_for(asyncio.shield(run), 10)
        else:
            await eventually(lambda: worker.stats.processed == 1, 10, "the retry's run")
            await asyncio.sleep(0.5)
            assert not run.done(), "the burst ended inside its broker's depth lag"
            worker.request_stop()
            await asyncio.wait_for(run, 10)
    finally:
        run.cancel()
        await app.close()
    assert runs == [1, 2]
    assert (worker.stats.processed, worker.stats.retried) == (1, 1)
