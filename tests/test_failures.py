"""Seeing repeated failures: error fingerprints, "this error, N times in the last 5 minutes"
counts, and the RunawayGuard that notices a task whose retries run away and slows it down.

Clocks are injected, so windows are tested without waiting.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.worker._failures import ErrorTracker, RunawayGuard, fingerprint
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(30)

FAST = aqw.RetryPolicy(max_retries=2, base=0.01, cap=0.02)


class Clock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- fingerprints ---------------------------------------------------------------------------------


def fails_here(message: str) -> None:
    raise ValueError(message)


def fails_there(message: str) -> None:
    raise ValueError(message)  # the same type, another line


def fails_as(kind: type[Exception], message: str) -> None:
    raise kind(message)  # one line, any type


def helper(which: int) -> None:
    if which == 1:
        raise LookupError("deep one")
    raise LookupError("deep two")  # another line of the helper


async def handler(which: int) -> None:
    helper(which)  # one handler line, whatever line of the helper raised


async def other_handler(which: int) -> None:
    if which == 1:
        helper(1)
    helper(2)  # a second handler line


def caught(fn: Callable[..., Any], *args: Any) -> BaseException:
    try:
        fn(*args)
    except Exception as exc:
        return exc
    raise AssertionError("did not raise")


async def caught_async(fn: Callable[..., Awaitable[Any]], *args: Any) -> BaseException:
    try:
        await fn(*args)
    except Exception as exc:
        return exc
    raise AssertionError("did not raise")


def test_the_same_error_at_the_same_line_has_the_same_fingerprint() -> None:
    a = fingerprint(caught(fails_here, "user 1 not found"))
    b = fingerprint(caught(fails_here, "user 2 not found"))  # the message does not matter
    assert a == b
    assert len(a) == 12 and int(a, 16) >= 0
    assert fingerprint(caught(fails_as, ValueError, "x")) == fingerprint(
        caught(fails_as, ValueError, "y")
    )


def test_other_lines_and_other_types_have_other_fingerprints() -> None:
    here = fingerprint(caught(fails_here, "m"))
    there = fingerprint(caught(fails_there, "m"))
    as_value = fingerprint(caught(fails_as, ValueError, "m"))
    as_key = fingerprint(caught(fails_as, KeyError, "m"))
    as_type = fingerprint(caught(fails_as, TypeError, "m"))
    assert len({here, there, as_value, as_key, as_type}) == 5


async def test_with_the_handler_given_its_line_decides() -> None:
    code = handler.__code__
    one = await caught_async(handler, 1)
    two = await caught_async(handler, 2)
    # different helper lines, one handler line: one fingerprint
    assert fingerprint(one, code) == fingerprint(two, code)
    # without the handler, the innermost frame decides: two fingerprints
    assert fingerprint(one) != fingerprint(two)
    # two handler lines: two fingerprints
    o1 = await caught_async(other_handler, 1)
    o2 = await caught_async(other_handler, 2)
    assert fingerprint(o1, other_handler.__code__) != fingerprint(o2, other_handler.__code__)
    # a handler that is not in the traceback falls back to the innermost frame
    assert fingerprint(one, fails_here.__code__) == fingerprint(one)


# -- counting over a sliding window ----------------------------------------------------------------


def test_error_tracker_counts_per_fingerprint_within_its_window() -> None:
    clock = Clock()
    tracker = ErrorTracker(window=300.0, clock=clock)
    assert tracker.top() == []
    fp1 = tracker.record(caught(fails_here, "a"), "t1")
    tracker.record(caught(fails_here, "b"), "t1")
    tracker.record(caught(fails_here, "c" * 2000), "t1")
    clock.advance(10)
    fp2 = tracker.record(caught(fails_as, KeyError, "k"), "t2")
    assert fp1 != fp2
    top = tracker.top()
    assert [(e.fingerprint, e.count, e.error_type, e.task) for e in top] == [
        (fp1, 3, "ValueError", "t1"),
        (fp2, 1, "KeyError", "t2"),
    ]
    assert top[0].message == "c" * 500  # the last message, cut to 500 characters
    assert top[0].last_seen == 1_000.0 and top[1].last_seen == 1_010.0
    assert tracker.count(fp1) == 3 and tracker.count("nothing") == 0

    clock.advance(240)  # t = 1250
    tracker.record(caught(fails_as, KeyError, "k2"), "t2")
    tracker.record(caught(fails_as, KeyError, "k3"), "t2")
    # a tie: the most recent first
    assert [(e.fingerprint, e.count) for e in tracker.top()] == [(fp2, 3), (fp1, 3)]
    assert [e.fingerprint for e in tracker.top(1)] == [fp2]

    clock.advance(50.5)  # t = 1300.5: the three at t = 1000 are older than 5 minutes
    assert tracker.count(fp1) == 0
    assert [(e.fingerprint, e.count) for e in tracker.top()] == [(fp2, 3)]
    clock.advance(10)  # t = 1310.5: the one at t = 1010 too
    assert [(e.fingerprint, e.count) for e in tracker.top()] == [(fp2, 2)]
    clock.advance(300)
    assert tracker.top() == []


async def test_worker_errors_report_counts_after_a_run_with_failures(backend: Backend) -> None:
    app = backend.app(retry=FAST)

    @app.task(name="import_file", max_retries=2)
    async def import_file(n: int) -> None:
        raise ValueError(f"bad row {n}")

    @app.task(name="sync", max_retries=0)
    async def sync(n: int) -> None:
        if n % 2:
            raise KeyError("missing")
        raise KeyError("also missing")  # another line: another fingerprint

    @app.task(name="fine")
    async def fine(n: int) -> None:
        pass

    for n in range(4):
        await import_file.enqueue(n)
    for n in range(3):
        await sync.enqueue(n)  # 1 odd, 2 even
    for n in range(5):
        await fine.enqueue(n)
    worker = app.worker(concurrency=1)
    clock = Clock(time.time())
    worker.errors = ErrorTracker(clock=clock)
    async with worker:
        await eventually(
            lambda: worker.stats.dead == 7 and worker.stats.processed == 5, 10, "the run"
        )
    top = worker.errors.top()
    assert [(e.error_type, e.task, e.count) for e in top] == [
        ("ValueError", "import_file", 12),  # 4 jobs x 3 runs
        ("KeyError", "sync", 2),
        ("KeyError", "sync", 1),
    ]
    assert top[0].message in {f"bad row {n}" for n in range(4)}  # the last one seen
    assert len({e.fingerprint for e in top}) == 3
    assert worker.errors.count(top[0].fingerprint) == 12
    summary = worker.summary()
    assert [(e["fingerprint"], e["count"]) for e in summary["errors"]] == [
        (e.fingerprint, e.count) for e in top
    ]
    assert worker.errors.window == 300.0  # "in the last 5 minutes"
    clock.advance(301)
    assert worker.errors.top() == []


# -- the runaway guard -----------------------------------------------------------------------------


def runaway_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "aqw.failures" and r.levelno >= logging.ERROR]


def test_a_task_retrying_past_the_threshold_is_flagged_logged_once_and_slowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    guard = RunawayGuard(window=60, threshold=0.5, min_runs=10, slow_factor=8, clock=clock)
    with caplog.at_level(logging.WARNING, logger="aqw.failures"):
        for _ in range(9):
            guard.record("pay", retried=True)
            clock.advance(1)
        assert guard.retry_rate("pay") == 1.0
        assert not guard.running_away("pay")  # fewer than min_runs runs
        assert guard.delay_factor("pay") == 1.0
        assert runaway_logs(caplog) == []

        guard.record("pay", retried=True)  # the 10th run
        assert guard.running_away("pay")
        assert guard.delay_factor("pay") == 8.0
        [record] = runaway_logs(caplog)
        message = record.getMessage()
        assert "'pay'" in message and "100%" in message and "threshold 50%" in message
        assert "slowing its retries down" in message

        for _ in range(30):  # still within the window of the warning: no second log
            clock.advance(1)
            guard.record("pay", retried=True)
        assert len(runaway_logs(caplog)) == 1

        clock.advance(31)  # 61 s after the warning, and still running away
        for _ in range(10):
            guard.record("pay", retried=True)
        assert len(runaway_logs(caplog)) == 2
    assert guard.delay_factor("other") == 1.0 and not guard.running_away("other")


def test_the_guard_recovers_when_the_rate_falls() -> None:
    clock = Clock()
    guard = RunawayGuard(window=60, threshold=0.5, min_runs=10, clock=clock)
    for _ in range(10):
        guard.record("pay", retried=True)
    assert guard.running_away("pay") and guard.delay_factor("pay") == 10.0
    for _ in range(10):
        guard.record("pay", retried=False)
    assert guard.retry_rate("pay") == 0.5
    assert not guard.running_away("pay"), "the threshold is exceeded only above 50%"
    assert guard.delay_factor("pay") == 1.0
    guard.record("pay", retried=True)  # 11 / 21 > 0.5: away again
    assert guard.running_away("pay")
    clock.advance(30)
    for _ in range(12):
        guard.record("pay", retried=False)  # 11 / 33
    assert not guard.running_away("pay")
    assert guard.retry_rate("pay") == pytest.approx(11 / 33)
    # time alone recovers it too: after the window nothing is left
    for _ in range(40):
        guard.record("pay", retried=True)
    assert guard.running_away("pay")
    clock.advance(61)
    assert guard.retry_rate("pay") == 0.0
    assert not guard.running_away("pay") and guard.delay_factor("pay") == 1.0


def test_action_log_only_logs(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    guard = RunawayGuard(window=60, min_runs=4, action="log", clock=clock)
    with caplog.at_level(logging.WARNING, logger="aqw.failures"):
        for _ in range(4):
            guard.record("pay", retried=True)
    assert guard.running_away("pay")
    assert guard.delay_factor("pay") == 1.0
    [record] = runaway_logs(caplog)
    assert "slowing" not in record.getMessage()
    with pytest.raises(ValueError, match="'log' or 'slow'"):
        RunawayGuard(action="panic")


def test_a_runaway_is_logged_with_a_clock_starting_at_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(start=0.0)
    guard = RunawayGuard(window=60, min_runs=5, clock=clock)
    with caplog.at_level(logging.WARNING, logger="aqw.failures"):
        for _ in range(5):
            clock.advance(1)
            guard.record("pay", retried=True)
    assert guard.running_away("pay")
    assert len(runaway_logs(caplog)) == 1


def test_the_window_keeps_slots_not_runs_and_counts_within_one_slot() -> None:
    clock = Clock()
    guard = RunawayGuard(window=60, threshold=0.5, min_runs=10, clock=clock)
    for _ in range(600):  # 10 minutes of 100 runs a second, a third of them retried
        for n in range(100):
            guard.record("pay", retried=n % 3 == 0)
        clock.advance(1)
    kept = guard._runs["pay"]
    assert len(kept.slots) <= 61  # one per second of the window, whatever the rate
    assert 6_000 <= kept.runs <= 6_100 and guard.retry_rate("pay") == pytest.approx(34 / 100)
    clock.advance(59)  # one slot of the last window left at most
    assert guard.retry_rate("pay") == pytest.approx(34 / 100) and kept.runs <= 100
    clock.advance(2)
    assert guard.retry_rate("pay") == 0.0 and kept.runs == 0 and not guard.running_away("pay")


async def test_the_worker_slows_a_runaway_task_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = aqw.App(
        "memory://t-runaway",
        retry=aqw.RetryPolicy(max_retries=1000, base=0.02, cap=0.02, jitter=False),
    )
    starts: list[float] = []

    @app.task(name="poisoned")
    async def poisoned() -> None:
        starts.append(time.monotonic())
        raise ConnectionError("the payment provider is down")

    @app.task(name="healthy")
    async def healthy() -> None:
        pass

    worker = app.worker()
    clock = Clock(time.time())
    worker.runaway = RunawayGuard(window=60, threshold=0.5, min_runs=5, slow_factor=15, clock=clock)
    await poisoned.enqueue()
    with caplog.at_level(logging.WARNING, logger="aqw.failures"):
        async with worker:
            await eventually(lambda: len(starts) >= 8, 10, "8 runs")
            assert worker.runaway.running_away("poisoned")
            assert worker.runaway.delay_factor("poisoned") == 15.0
            assert worker.summary()["runaway"] == ["poisoned"]
            assert not worker.runaway.running_away("healthy")
            clock.advance(61)  # the window slides past every run so far
            await eventually(lambda: len(starts) >= 11, 10, "11 runs")
            assert worker.summary()["runaway"] == []
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # the delay after failure k uses the k - 1 runs recorded before it: the 6th is the first slowed
    assert all(g < 0.15 for g in gaps[:5]), gaps
    assert all(g >= 0.28 for g in gaps[5:7]), gaps  # 0.02 s x 15 (wall and monotonic clocks differ)
    assert all(g < 0.15 for g in gaps[8:10]), gaps  # recovered
    logs = runaway_logs(caplog)
    assert len(logs) == 1, [r.getMessage() for r in logs]
    assert "'poisoned'" in logs[0].getMessage()
