"""The queue-control and rates parts (``broker.control``, ``broker.rates``) on the
in-process broker, fakeredis and the real Redis: pause and resume (a worker fetches nothing
from a paused queue and takes up again on resume), the waiting list per priority level,
deleting a waiting job, promoting a delayed one, and the rates the workers add with their
heartbeat (counts per task and outcome, durations, by minute and hour)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from aqw.brokers.tallies import TaskTally, duration_bucket, quantile
from aqw.job import Job
from tests._helpers import eventually
from tests.conftest import Backend, open_backend


def _ids(page: list[object]) -> list[str]:
    return [Job.decode(w.data).id for w in page]  # type: ignore[attr-defined]


@pytest.fixture(
    params=["fakeredis-partitioned", pytest.param("redis-partitioned", marks=pytest.mark.redis)]
)
async def partitioned(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    async with open_backend(request.param, queue_name) as b:
        yield b


async def test_pause_stops_fetching_and_resume_takes_up_again(backend: Backend) -> None:
    await _pause_and_resume(backend)


async def test_pause_and_resume_a_partitioned_queue(partitioned: Backend) -> None:
    await _pause_and_resume(partitioned)


async def _pause_and_resume(backend: Backend) -> None:
    app = backend.app()
    done: list[int] = []

    @app.task
    async def note(n: int) -> None:
        done.append(n)

    control = app.broker.control
    assert control is not None
    assert await control.pause() is True
    assert await control.pause() is False  # paused already
    assert await control.paused() is True
    for n in range(3):
        await note.enqueue(n)
    async with app.worker(heartbeat=0.2) as worker:
        # the worker reads the flag before its first fetch and about once a second after
        await eventually(lambda: worker.intake.paused, 5, "the worker sees the pause")
        await asyncio.sleep(1.5)  # several polls and fetch turns: still nothing taken
        assert done == []
        assert (await app.broker.depth()).waiting == 3
        assert await control.resume() is True
        await eventually(lambda: len(done) == 3, 10, "the jobs run after resume")
    assert sorted(done) == [0, 1, 2]
    assert await control.resume() is False
    assert await control.paused() is False


async def test_a_burst_worker_on_a_paused_queue_stops(backend: Backend) -> None:
    app = backend.app()

    @app.task
    async def note(n: int) -> None: ...

    await note.enqueue(1)
    assert app.broker.control is not None
    await app.broker.control.pause()
    async with app.worker(burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 10)
    assert (await app.broker.depth()).waiting == 1  # left for after the resume


async def test_waiting_list_per_level_pages_and_delete(backend: Backend) -> None:
    app = backend.app()

    @app.task
    async def note(n: int) -> None: ...

    low = [await note.enqueue(n) for n in range(5)]
    high = await note.enqueue(99, priority=5)
    control = app.broker.control
    assert control is not None
    counts = await control.waiting_counts()
    assert counts[0] == 5 and counts[5] == 1
    first = await control.waiting_page(0, None, 2)
    assert _ids(first) == [low[0], low[1]]
    second = await control.waiting_page(0, first[-1].entry_id, 2)
    assert _ids(second) == [low[2], low[3]]
    assert _ids(await control.waiting_page(5, None, 10)) == [high]
    assert await control.delete_waiting(0, second[0].entry_id) is True
    assert await control.delete_waiting(0, second[0].entry_id) is False  # gone
    assert _ids(await control.waiting_page(0, None, 10)) == [
        low[0],
        low[1],
        low[3],
        low[4],
    ]
    assert (await app.broker.depth()).waiting == 5


async def test_a_taken_job_is_not_deleted(backend: Backend) -> None:
    app = backend.app()

    @app.task
    async def note(n: int) -> None: ...

    await note.enqueue(1)
    control = app.broker.control
    assert control is not None
    [entry] = await control.waiting_page(0, None, 10)
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    [delivery] = await app.broker.fetch(1, 0.1)
    assert delivery.id == entry.entry_id
    assert await control.waiting_page(0, None, 10) == []  # taken: not waiting any more
    assert await control.delete_waiting(0, entry.entry_id) is False
    assert (await app.broker.depth()).in_flight == 1


async def test_promote_makes_a_delayed_job_due_now(backend: Backend) -> None:
    app = backend.app()

    @app.task
    async def note(n: int) -> None: ...

    later = await note.enqueue(1, delay=3600)
    other = await note.enqueue(2, delay=3600)
    control = app.broker.control
    assert control is not None
    assert await control.promote("no-such-job") is False
    assert await control.promote(later) is True
    await app.broker.promote_due()
    depth = await app.broker.depth()
    assert (depth.waiting, depth.delayed) == (1, 1)
    assert _ids(await control.waiting_page(0, None, 10)) == [later]
    assert other != later


async def test_workers_add_their_counts_to_the_rates(backend: Backend) -> None:
    app = backend.app()

    @app.task
    async def good(n: int) -> None: ...

    @app.task(max_retries=0)
    async def bad(n: int) -> None:
        raise ValueError("no")

    for n in range(4):
        await good.enqueue(n)
    await bad.enqueue(1)
    async with app.worker(burst=True, heartbeat=0.2) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 20)
    rates = app.broker.rates
    assert rates is not None
    hour_ago = time.time() - 3600
    for hourly in (False, True):
        buckets = await rates.read(hour_ago - 3600, hourly)
        merged: dict[str, TaskTally] = {}
        for tasks in buckets.values():
            for task, tally in tasks.items():
                merged.setdefault(task, TaskTally()).merge(tally)
        good_name, bad_name = good.name, bad.name
        assert merged[good_name].counts.get("processed") == 4
        assert merged[bad_name].counts.get("failed") == 1
        assert merged[bad_name].counts.get("dead") == 1
        assert sum(merged[good_name].durations.values()) == 4
    # the stop added everything: a second final flush adds nothing
    await worker.stop()


async def test_rates_are_summed_per_bucket(backend: Backend) -> None:
    rates = backend.app().broker.rates
    assert rates is not None
    now = time.time()
    minute = now - now % 60
    tally = TaskTally({"processed": 2}, {duration_bucket(0.01): 2})
    await rates.add({minute: {"t": tally}})
    await rates.add({minute: {"t": TaskTally({"processed": 1, "failed": 1})}})
    [(start, tasks)] = (await rates.read(minute, False)).items()
    assert start == minute
    assert tasks["t"].counts == {"processed": 3, "failed": 1}
    hours = await rates.read(now - 7200, True)
    assert sum(t["t"].counts["processed"] for t in hours.values()) == 3
    p50 = quantile(tasks["t"].durations, 0.5)
    assert p50 is not None and 0.01 <= p50 < 0.012 * 1.2


async def test_rate_buckets_are_trimmed_by_age(backend: Backend) -> None:
    from aqw.brokers.tallies import HOUR_KEEP, MINUTE_KEEP

    app = backend.app()
    rates = app.broker.rates
    assert rates is not None
    now = time.time()
    minute = now - now % 60
    old = minute - MINUTE_KEEP - 600
    await rates.add({old: {"t": TaskTally({"processed": 1})}})
    await rates.add({minute: {"t": TaskTally({"processed": 1})}})
    if backend.raw is not None:  # Redis: each hash expires with its bucket's keep time
        tag = app.broker.keys.tag  # type: ignore[attr-defined]
        ttl_m = await backend.raw.ttl(f"{tag}:rates:m:{int(minute)}")
        ttl_h = await backend.raw.ttl(f"{tag}:rates:h:{int(minute - minute % 3600)}")
        assert 0 < ttl_m <= MINUTE_KEEP and MINUTE_KEEP < ttl_h <= HOUR_KEEP
        assert not await backend.raw.exists(f"{tag}:rates:m:{int(old)}")  # too old to keep
    else:  # in process: dropped as newer ones come
        assert list(await rates.read(old - 60, False)) == [minute]


def test_quantile_of_a_histogram() -> None:
    hist = {duration_bucket(0.001): 98, duration_bucket(1.0): 2}
    p50, p99 = quantile(hist, 0.5), quantile(hist, 0.99)
    assert p50 is not None and p99 is not None
    assert 0.001 <= p50 < 0.0013 and 1.0 <= p99 < 1.3
    assert quantile({}, 0.5) is None


@pytest.mark.parametrize("final", [False, True])
def test_unflushed_takes_whole_slots_unless_final(final: bool) -> None:
    from aqw.worker._stats import SlidingStats

    clock = [1000.0]
    stats = SlidingStats(clock=lambda: clock[0])
    stats.count("processed", "t")
    stats.duration(0.5, "t")
    clock[0] = 1012.0
    stats.count("processed", "t")
    tallies, mark = stats.unflushed(final)
    assert sum(t["t"].counts["processed"] for t in tallies.values()) == (2 if final else 1)
    stats.flushed_to(mark)
    again, _ = stats.unflushed(final)
    assert again == {}
    assert stats.totals(60) == {"processed": 2}


async def test_a_fetch_waiting_as_the_queue_is_paused_gives_its_jobs_back(
    backend: Backend,
) -> None:
    app = backend.app()
    done: list[int] = []

    @app.task
    async def note(n: int) -> None:
        done.append(n)

    control = app.broker.control
    assert control is not None
    async with app.worker() as worker:
        await note.enqueue(0)
        await eventually(lambda: done == [0], 10, "a first job runs")
        await asyncio.sleep(0.3)  # the fetch loop is back in a blocking fetch
        await control.pause()
        await eventually(lambda: worker.intake.paused, 5, "the worker sees the pause")
        job_id = await note.enqueue(1)
        await asyncio.sleep(2.5)  # past the blocked fetch's end, and a few polls
        assert done == [0]
        info = await app.job(job_id)
        assert info is not None and info.state == "queued"
        assert (await app.broker.depth()).waiting == 1
        await control.resume()
        await eventually(lambda: done == [0, 1], 10, "the job runs after resume")


async def test_a_worker_of_several_queues_skips_the_paused_ones(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app = backend.app()
    first, second = queue_names(), queue_names()
    done: list[str] = []

    @app.task
    async def note(queue: str) -> None:
        done.append(queue)

    paused_part = app.broker_for(second).control
    assert paused_part is not None
    await paused_part.pause()
    async with app.worker(queues=[first, second], heartbeat=0.2) as worker:
        await note.enqueue(second, queue=second)
        await note.enqueue(first, queue=first)
        await eventually(lambda: done == [first], 10, "the job of the running queue")
        await asyncio.sleep(1.5)  # several polls: the paused queue's job still waits
        assert done == [first]
        assert not worker.intake.paused  # one queue of two is paused: the worker fetches
        assert (await app.broker_for(second).depth()).waiting == 1
        await paused_part.resume()
        await eventually(lambda: done == [first, second], 10, "the job after resume")
