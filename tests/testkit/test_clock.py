"""``aqw.testing.MockClock``: time that jumps to the next timer instead of waiting, on the
event loop and on ``memory://`` (delays, retries, handler deadlines, lease and idempotency
TTLs). Each test would take minutes to hours of real time without it; the module's
timeout is a minute, so a clock that really waited fails the test. Asserted on order,
state and the clock's own offset, never on elapsed real time."""

from __future__ import annotations

import asyncio
import time

import pytest

import aqw
from aqw.brokers.local.clock import SYSTEM
from aqw.brokers.local.clock import clock as parts_clock
from aqw.testing import MockClock, use_memory

pytestmark = pytest.mark.timeout(60)

HOUR = 3600.0


async def test_sleepers_wake_in_deadline_order_without_waiting() -> None:
    woke: list[int] = []

    async def sleeper(minutes: int) -> None:
        await asyncio.sleep(minutes * 60)
        woke.append(minutes)

    async with MockClock() as clock:
        assert clock.jumps == 0
        loop = asyncio.get_running_loop()
        before = loop.time()
        await asyncio.gather(sleeper(30), sleeper(10), sleeper(20))
        assert woke == [10, 20, 30] and clock.jumps >= 3
        assert loop.time() - before >= 30 * 60
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(HOUR):
                await asyncio.Event().wait()  # never set: the timeout fires, an hour on
        assert loop.time() - before >= 30 * 60 + HOUR
    assert parts_clock.source is SYSTEM  # the memory broker reads the real clocks again


async def test_jump_moves_time_on_by_hand() -> None:
    async with MockClock(autojump=False) as clock:
        assert parts_clock.source is clock
        now = clock.monotonic()
        clock.jump(90)
        assert clock.monotonic() >= now + 90 and asyncio.get_running_loop().time() >= now + 90
        with pytest.raises(ValueError, match="only moves forward"):
            clock.jump(-1)


async def test_one_clock_per_loop() -> None:
    async with MockClock():
        with pytest.raises(RuntimeError, match="has a MockClock already"):
            async with MockClock():
                pass


app = aqw.App("memory://clock", queue="clock", retry=aqw.RetryPolicy(base=60.0, jitter=False))
tries: list[int] = []


@app.task(keep_result=True)
async def later(n: int) -> int:
    return n


@app.task(max_retries=3, keep_result=True)
async def flaky(n: int) -> int:
    tries.append(n)
    if len(tries) < 3:
        raise ConnectionError(f"try {len(tries)}")
    return n


@app.task(timeout=5 * 60.0, max_retries=0, lease_ttl=30.0)
async def stuck() -> None:
    await asyncio.sleep(HOUR)  # its 5 minute deadline stops it, its 30 s lease renewed


@app.task(lease_ttl=30.0)
async def long_run(minutes: int) -> None:
    await asyncio.sleep(minutes * 60)  # a ten-minute job under a 30 s lease


@pytest.fixture
def kit() -> aqw.App:
    tries.clear()
    with use_memory(app):
        yield app


async def test_a_step_of_the_wall_clock_does_not_run_a_delayed_job_early(
    kit: aqw.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VM's time sync steps the wall clock: the mock's wall clock does not follow it, so a
    job delayed an hour still waits an hour of the loop's time (it once ran 18 ms early)."""
    async with MockClock() as clock:
        start = clock.monotonic()
        job = await later.enqueue(7, delay=HOUR)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 30.0)  # stepped 30 s forward
        async with kit.worker():
            assert await kit.result(job, timeout=2 * HOUR) == 7
        assert clock.monotonic() - start >= HOUR


async def test_a_job_delayed_an_hour_runs_an_hour_later(kit: aqw.App) -> None:
    async with MockClock() as clock:
        start = clock.monotonic()
        job = await later.enqueue(7, delay=HOUR)
        async with kit.worker():
            assert (await kit.job(job)).state == "delayed"
            assert await kit.result(job, timeout=2 * HOUR) == 7
        assert clock.monotonic() - start >= HOUR


async def test_retries_back_off_in_clock_time(kit: aqw.App) -> None:
    async with MockClock() as clock:
        start = clock.monotonic()
        job = await flaky.enqueue(1)
        async with kit.worker() as worker:
            assert await kit.result(job, timeout=HOUR) == 1
            assert worker.stats.retried == 2
        assert tries == [1, 1, 1]
        mock_seconds = clock.monotonic() - start  # the mock clock's time: no load moves it
        assert mock_seconds >= 60 + 120  # the backoffs, 60 s then 120 s (no jitter)


async def test_a_handler_past_its_timeout_is_stopped(kit: aqw.App) -> None:
    async with MockClock() as clock:
        start = clock.monotonic()
        job = await stuck.enqueue()
        async with kit.worker():
            with pytest.raises(aqw.JobFailed, match="JobTimeout"):
                await kit.result(job, timeout=HOUR)
        assert 5 * 60 <= clock.monotonic() - start < HOUR  # stopped at its deadline


async def test_a_lease_is_renewed_through_a_long_job(kit: aqw.App) -> None:
    async with MockClock() as clock:
        start = clock.monotonic()
        job = await long_run.enqueue(10)
        async with kit.worker() as worker:
            assert await kit.result(job, timeout=HOUR) is None
            assert worker.stats.lease_lost == 0 and worker.stats.processed == 1
        mock_seconds = clock.monotonic() - start  # the mock clock's time: no load moves it
        assert mock_seconds >= 10 * 60
        assert (await kit.job(job)).attempts == 1  # never reclaimed: its lease was kept


async def test_an_idempotency_key_expires_with_the_clock(kit: aqw.App) -> None:
    async with MockClock(autojump=False) as clock:
        first = await later.enqueue(1, key="k")
        again = await later.enqueue(2, key="k")
        assert again == first and again.duplicate
        clock.jump(kit.idempotency_ttl + 1)
        fresh = await later.enqueue(3, key="k")
        assert fresh != first and not fresh.duplicate


def test_another_loop_kind_is_refused_in_one_line() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def enter() -> None:
        async with MockClock():
            pass

    with (
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
        pytest.raises(TypeError, match="needs asyncio's selector event loop, not Loop"),
    ):
        runner.run(enter())
    assert parts_clock.source is SYSTEM
