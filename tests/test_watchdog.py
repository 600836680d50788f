"""The blocked-loop watchdog: a handler that blocks the event loop (``time.sleep``) starves
every lease renewal of its worker; the worker says so, naming the job, and counts it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import Backend, open_backend

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.worker._running import RunningJobs, WorkerStats
from aqw.worker._watchdog import LoopWatchdog
from tests._helpers import run_burst

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("error")]


@pytest.fixture(params=["memory", "fakeredis"])
async def backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    async with open_backend(request.param, queue_name) as b:
        yield b


def blocked_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "aqw.worker"
        and r.levelno == logging.WARNING
        and "event loop blocked" in r.getMessage()
    ]


async def test_a_handler_that_sleeps_in_the_loop_is_named(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend.app(lease_ttl=1)

    @app.task(name="sleepy")
    async def sleepy() -> None:
        time.sleep(0.6)  # noqa: ASYNC251 - the bug this test is about

    job_id = await sleepy.enqueue()
    with caplog.at_level(logging.WARNING, logger="aqw"):
        worker = await run_burst(app)
    assert worker.stats.processed == 1  # 0.6 s < lease_ttl: the job survives, with a warning
    assert worker.stats.loop_blocked >= 1
    assert worker.summary()["totals"]["loop_blocked"] == worker.stats.loop_blocked
    [warning, *_] = blocked_warnings(caplog)
    text = warning.getMessage()
    assert f"sleepy (job {job_id} attempt 1)" in text, text
    assert "time.sleep" in text and "asyncio.to_thread" in text
    blocked: Any = warning.blocked_s  # type: ignore[attr-defined]
    assert 0.3 < blocked < 5.0
    assert (warning.job_id, warning.task, warning.attempt) == (job_id, "sleepy", 1)  # type: ignore[attr-defined]


async def test_a_handler_that_awaits_is_not_reported(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend.app(lease_ttl=1)

    @app.task(name="patient")
    async def patient() -> None:
        await asyncio.sleep(0.6)

    await patient.enqueue()
    with caplog.at_level(logging.WARNING, logger="aqw"):
        worker = await run_burst(app)
    assert worker.stats.processed == 1
    assert worker.stats.loop_blocked == 0
    assert blocked_warnings(caplog) == []


def test_the_defaults_follow_the_shortest_lease_ttl() -> None:
    def watchdog(**options: Any) -> LoopWatchdog:
        running = RunningJobs(MemoryBroker("wd"), "w", lambda coro: None)
        tel = aqw.App("memory://wd").telemetry
        return LoopWatchdog(running, WorkerStats(), tel, **options)

    default = watchdog(min_ttl=30.0)
    assert (default.interval, default.threshold) == (0.25, 10.0)
    short = watchdog(min_ttl=0.6)
    assert short.interval == pytest.approx(0.15) and short.threshold == pytest.approx(0.2)
    assert watchdog(min_ttl=1.0, interval=0.05, threshold=0.1).threshold == 0.1

    app = aqw.App("memory://wd-app", lease_ttl=30)

    @app.task(name="quick", lease_ttl=2)
    async def quick() -> None:
        pass

    assert LoopWatchdog.of(app.worker()).threshold == pytest.approx(2 / 3)


async def test_a_stall_with_nothing_running_says_so(caplog: pytest.LogCaptureFixture) -> None:
    stats = WorkerStats()
    running = RunningJobs(MemoryBroker("wd-idle"), "w", lambda coro: None)
    dog = LoopWatchdog(
        running, stats, aqw.App("memory://wd-idle").telemetry, min_ttl=1.0, interval=0.01
    )
    task = asyncio.get_running_loop().create_task(dog.run())
    try:
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="aqw"):
            time.sleep(0.5)  # noqa: ASYNC251 - a stall of the test's own loop
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert stats.loop_blocked == 1
    [warning] = blocked_warnings(caplog)
    assert "while running no job" in warning.getMessage()
    assert not hasattr(warning, "job_id")
