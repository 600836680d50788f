"""A cancel reaches the worker that runs the job at once, not at its next lease renewal:
the memory broker tells the worker directly, Redis publishes the job id on the queue's
channel (``aqw/brokers/redis/_cancels.py``), to which every worker listens.

Each job here has a one-hour lease: its renewals, which also read the cancel mark, come
minutes apart (ttl/3, or from ttl/10 when renewed early with others: 360 s at the
soonest), so a handler stopped before its two-hour sleep ends, with ``JobCancelled``
within 60 s of the cancel, can only come from the push (before it, the renewal poll took
50 s with a 300 s lease). Asserted on order and state, with minutes of margin."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis._cancels import cancel_channel
from aqw.cli._job import stopping_line
from tests._helpers import eventually, running
from tests.conftest import PrivateRedis, open_backend
from tests.test_outages import restart_after

pytestmark = pytest.mark.timeout(120)

#: The jobs' lease TTL, seconds.
LEASE = 3600.0

KINDS = [
    "memory",
    "fakeredis",
    "fakeredis-partitioned",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-partitioned", marks=pytest.mark.redis),
]


async def _listening(app: aqw.App, raw: object) -> bool:
    """Every partition's cancel channel has a subscriber (the worker's)."""
    broker = app.broker
    parts = getattr(broker, "parts", None) or [broker]
    channels = [cancel_channel(p.keys) for p in parts]
    counts = await raw.pubsub_numsub(*channels)  # type: ignore[attr-defined]
    return all(n >= 1 for _, n in counts)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_running_job_cancelled_stops_long_before_its_next_renewal(
    kind: str, queue_name: str
) -> None:
    async with open_backend(kind, queue_name) as backend:
        app = backend.app(lease_ttl=LEASE)
        started = asyncio.Event()
        order: list[str] = []

        @app.task(name="long")
        async def long() -> None:
            order.append("started")
            started.set()
            try:
                await asyncio.sleep(2 * LEASE)
            except asyncio.CancelledError:
                order.append("stopped")
                raise
            order.append("slept")

        job_id = await long.enqueue()
        async with running(app.worker()) as worker:
            await asyncio.wait_for(started.wait(), 30)
            if backend.raw is not None:  # subscribed before the cancel is published
                await eventually(lambda: _listening(app, backend.raw), 30, "subscribed")
            assert await app.cancel(job_id) == "cancelling"
            with pytest.raises(aqw.JobCancelled):
                await app.result(job_id, timeout=60)  # its next renewal: minutes away
            assert order == ["started", "stopped"]
            await eventually(lambda: worker.stats.cancelled == 1, 30, "counted")
            assert worker.stats.retried == 0 and worker.stats.dead == 0
        info = await app.job(job_id)
        assert info is not None and info.state == "cancelled" and info.attempts == 1


async def test_a_cancel_for_another_workers_job_is_ignored(queue_name: str) -> None:
    async with open_backend("memory", queue_name) as backend:
        app = backend.app(lease_ttl=300.0)
        gate = asyncio.Event()

        @app.task(name="wait")
        async def wait(tag: str) -> str:
            await gate.wait()
            return tag

        mine = await wait.enqueue("mine")
        async with running(app.worker()) as worker:
            await eventually(lambda: worker.in_flight == 1, 30, "running")
            worker.running.cancel("some-other-job")  # what a push for another job does
            gate.set()
            assert await app.result(mine, timeout=30) is None
        info = await app.job(mine)
        assert info is not None and info.state == "succeeded"


def test_the_cancel_line_states_the_bound_of_its_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    app = aqw.App("memory://cancel-line", lease_ttl=30.0)

    @app.task(name="slow", lease_ttl=90.0)
    async def slow() -> None: ...

    assert stopping_line(app, "slow") == (
        "cancelling: its worker is told now and stops the handler within about a second "
        "(at its next lease renewal, within ttl/3 = 30s, if the word does not reach it)"
    )
    monkeypatch.setattr(MemoryBroker, "pushes_cancels", False)  # as a broker without push
    assert stopping_line(app, "gone") == (
        "cancelling: its handler is stopped at its next lease renewal (within ttl/3 = 10s)"
    )


async def test_without_the_push_the_renewal_still_stops_it(
    queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback: a worker the word does not reach reads the mark with a renewal."""
    monkeypatch.setattr(MemoryBroker, "watch_cancels", aqw.Broker.watch_cancels)
    async with open_backend("memory", queue_name) as backend:
        app = backend.app(lease_ttl=0.6)  # renewed every 0.2 s
        started = asyncio.Event()
        order: list[str] = []

        @app.task(name="long")
        async def long() -> None:
            started.set()
            try:
                await asyncio.sleep(LEASE)
            except asyncio.CancelledError:
                order.append("stopped")
                raise

        job_id = await long.enqueue()
        async with running(app.worker()):
            await asyncio.wait_for(started.wait(), 30)
            assert await app.cancel(job_id) == "cancelling"
            with pytest.raises(aqw.JobCancelled):
                await app.result(job_id, timeout=60)
        assert order == ["stopped"]


async def test_the_push_comes_back_after_a_redis_restart(private_redis: PrivateRedis) -> None:
    """The listener subscribes again once Redis is back: a cancel after the restart still
    stops the handler long before a renewal would."""
    app = aqw.App(private_redis.url, queue="push", lease_ttl=LEASE)
    admin = Redis.from_url(private_redis.url)
    started = asyncio.Event()
    order: list[str] = []

    @app.task(name="long")
    async def long() -> None:
        started.set()
        try:
            await asyncio.sleep(2 * LEASE)
        except asyncio.CancelledError:
            order.append("stopped")
            raise

    try:
        async with running(app.worker()):
            await eventually(lambda: _listening(app, admin), 30, "subscribed")
            await restart_after(private_redis, admin, 0.5)
            await eventually(lambda: _listening(app, admin), 30, "subscribed again")
            job_id = await long.enqueue()
            await asyncio.wait_for(started.wait(), 30)
            assert await app.cancel(job_id) == "cancelling"
            with pytest.raises(aqw.JobCancelled):
                await app.result(job_id, timeout=60)
        assert order == ["stopped"]
    finally:
        await admin.aclose()
        await app.close()
