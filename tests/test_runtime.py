"""The worker runtime on the memory broker, fakeredis and the real Redis.

Counts are exact: a job done twice, a job lost, an ack that should not have happened all fail.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import pytest
from _proxy import TcpProxy
from conftest import Backend, PrivateRedis
from pydantic import BaseModel, Field, ValidationError

import aqw
from aqw._redis import scripts as _scripts
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from tests._helpers import (
    assert_stream_empty,
    depth,
    eventually,
    run_burst,
    running,
    stop_all,
)

pytestmark = pytest.mark.timeout(60)

FAST_RETRY = aqw.RetryPolicy(max_retries=3, base=0.01, cap=0.02)


# -- throughput and exactly-once under concurrency ----------------------------------------------


async def test_thousand_jobs_over_three_workers_each_done_once(backend: Backend) -> None:
    done: Counter[int] = Counter()
    by_worker: Counter[str] = Counter()
    apps = []
    for _ in range(3):
        app = backend.app(lease_ttl=5.0)

        @app.task(name="work")
        async def work(n: int, ctx: aqw.Context) -> None:
            await asyncio.sleep(random.uniform(0, 0.003))
            done[n] += 1
            by_worker[ctx.worker.name] += 1

        apps.append(app)
    await apps[0].tasks["work"].enqueue_many(list(range(1000)))
    workers = [app.worker(concurrency=20) for app in apps]
    for w in workers:
        await w.start()
    try:
        await eventually(lambda: sum(done.values()) >= 1000, 45, "1,000 jobs")
        await eventually(lambda: sum(w.stats.processed for w in workers) >= 1000, 5, "acks")
    finally:
        await stop_all(*workers)
    assert done == Counter(range(1000)), "some job ran twice or never"
    assert [w.stats.processed for w in workers] == [by_worker[w.name] for w in workers]
    assert all(by_worker[w.name] > 0 for w in workers), dict(by_worker)
    assert sum(w.stats.failed + w.stats.lease_busy + w.stats.lease_lost for w in workers) == 0
    assert await depth(apps[0]) == (0, 0, 0, 0)
    assert (await apps[0].broker.stats()).get("processed") == 1000
    await assert_stream_empty(backend, apps[0])


async def test_graceful_shutdown_mid_run_loses_nothing(backend: Backend) -> None:
    started: Counter[int] = Counter()
    completed: Counter[int] = Counter()

    def register(app: aqw.App) -> None:
        @app.task(name="slow")
        async def slow(n: int) -> None:
            started[n] += 1
            await asyncio.sleep(random.uniform(0.02, 0.25))
            completed[n] += 1  # nothing awaits after this: a completed handler is acked

    apps = [backend.app(lease_ttl=1.0) for _ in range(3)]
    for app in apps:
        register(app)
    await apps[0].tasks["slow"].enqueue_many(list(range(200)))
    workers = [app.worker(concurrency=10, grace=0.05) for app in apps]
    for w in workers:
        await w.start()
    await eventually(lambda: sum(completed.values()) >= 40, 30, "40 completions")
    await stop_all(*workers)
    interrupted = sum(started.values()) - sum(completed.values())
    assert interrupted > 0, "the stop did not interrupt any job: the test proves nothing"
    # every interrupted handler was handed back (a job cancelled before its handler started
    # is handed back too, hence >=)
    assert sum(w.stats.requeued for w in workers) >= interrupted
    assert max(completed.values()) == 1

    fresh = backend.app(lease_ttl=1.0)
    register(fresh)
    await run_burst(fresh, within=30, concurrency=50)
    assert completed == Counter(range(200)), "a job was lost or completed twice"
    assert await depth(fresh) == (0, 0, 0, 0)
    await assert_stream_empty(backend, fresh)


# -- failures: timeout, exceptions, retries, DLQ ---------------------------------------------------


async def test_a_handler_past_its_timeout_is_never_acked(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    runs = 0

    @app.task(timeout=0.2, max_retries=1)
    async def stuck() -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(3600)  # only the timeout ends it: else the burst never ends

    await stuck.enqueue()
    worker = await run_burst(app)
    assert runs == 2  # the first run and one retry, each cut at 0.2 s
    assert worker.stats.processed == 0
    assert (worker.stats.retried, worker.stats.dead) == (1, 1)
    stats = await app.broker.stats()
    assert stats.get("processed", 0) == 0
    dead = await app.dlq.list()
    assert len(dead) == 1
    assert dead[0].error_type == "JobTimeout"
    assert "timeout of 0.2s" in dead[0].error
    assert dead[0].attempts == 2
    assert await depth(app) == (0, 0, 0, 1)


async def test_a_raising_handler_is_retried_not_lost(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    attempts: list[int] = []

    @app.task(max_retries=5)
    async def flaky(n: int, ctx: aqw.Context) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"flaky {n}")

    job_id = await flaky.enqueue(7)
    worker = await run_burst(app)
    assert attempts == [1, 2, 3]
    assert (worker.stats.processed, worker.stats.retried, worker.stats.dead) == (1, 2, 0)
    assert await depth(app) == (0, 0, 0, 0)
    assert job_id


async def test_max_retries_is_exact_and_dead_letters_once(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    runs = 0

    @app.task(max_retries=4)
    async def doomed() -> None:
        nonlocal runs
        runs += 1
        raise ValueError("boom")

    job_id = await doomed.enqueue()
    worker = await run_burst(app)
    assert runs == 5
    assert (worker.stats.retried, worker.stats.dead, worker.stats.processed) == (4, 1, 0)
    dead = await app.dlq.list()
    assert len(dead) == 1
    assert (dead[0].job_id, dead[0].error_type, dead[0].attempts) == (job_id, "ValueError", 5)
    assert dead[0].error == "ValueError: boom"
    assert "raise ValueError" in dead[0].traceback
    assert await depth(app) == (0, 0, 0, 1)


async def test_no_retry_errors_go_straight_to_the_dlq(backend: Backend) -> None:
    app = backend.app(retry=aqw.RetryPolicy(base=0.01, cap=0.02, no_retry=(KeyError,)))
    runs = 0

    @app.task
    async def picky() -> None:
        nonlocal runs
        runs += 1
        raise KeyError("missing")

    await picky.enqueue()
    await run_burst(app)
    assert runs == 1
    assert [d.error_type for d in await app.dlq.list()] == ["KeyError"]


async def test_retry_with_delay_runs_again_after_the_delay(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    runs: list[float] = []

    @app.task
    async def later(ctx: aqw.Context) -> None:
        runs.append(time.time())
        if ctx.attempt == 1:
            raise aqw.Retry(delay=0.5, reason="not yet")

    await later.enqueue()
    # not a burst worker: see test_burst_does_not_stop_when_the_check_itself_promotes_a_job
    async with running(app.worker()) as worker:
        await eventually(lambda: worker.stats.processed == 1, 10, "the second run")
    assert len(runs) == 2
    assert 0.49 <= runs[1] - runs[0] < 2.0
    assert (worker.stats.retried, worker.stats.processed, worker.stats.dead) == (1, 1, 0)
    assert await depth(app) == (0, 0, 0, 0)


async def test_retry_counts_against_max_retries(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    runs = 0

    @app.task(max_retries=2)
    async def again() -> None:
        nonlocal runs
        runs += 1
        raise aqw.Retry(delay=0)

    await again.enqueue()
    await run_burst(app)
    assert runs == 3
    dead = await app.dlq.list()
    assert [(d.error_type, d.attempts) for d in dead] == [("Retry", 3)]


async def test_reject_dead_letters_at_once_with_the_reason(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    runs = 0

    @app.task(max_retries=5)
    async def refuse(n: int) -> None:
        nonlocal runs
        runs += 1
        raise aqw.Reject(f"order {n} is cancelled")

    await refuse.enqueue(42)
    worker = await run_burst(app)
    assert runs == 1
    assert (worker.stats.retried, worker.stats.dead, worker.stats.processed) == (0, 1, 0)
    dead = await app.dlq.list()
    assert len(dead) == 1
    assert dead[0].error_type == "Reject"
    assert "order 42 is cancelled" in dead[0].error
    assert dead[0].job is not None and dead[0].job.payload == 42


# -- the payload and the context ------------------------------------------------------------------


class Item(BaseModel):
    sku: str
    qty: int = Field(gt=0)


async def test_payload_is_validated_at_enqueue_and_nothing_is_written(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="order")
    async def order(item: Item) -> None:
        raise AssertionError("never runs")

    @app.task
    async def pair(a: int, b: str) -> None:
        raise AssertionError("never runs")

    with pytest.raises(ValidationError):
        await order.enqueue({"sku": "a", "qty": 0})
    with pytest.raises(ValidationError):
        await order.enqueue({"sku": "a", "qty": 1}, delay=5)  # fine payload...
        await order.enqueue({"qty": 1}, delay=5)  # ...and a bad one
    with pytest.raises(ValidationError):
        await order.enqueue_many([{"sku": "a", "qty": 1}, {"sku": "b", "qty": "many"}])
    with pytest.raises(ValidationError):
        await pair.enqueue({"a": "x", "b": "y"})
    with pytest.raises(ValidationError):
        await app.enqueue("order", [Item(sku="ok", qty=1), {"sku": None, "qty": 1}])
    # only the one valid delayed job was written
    assert await depth(app) == (0, 0, 1, 0)
    if backend.raw is not None:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        assert await backend.raw.exists(broker.keys.stream) == 0


async def test_context_carries_job_id_attempt_and_fencing_token(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, tuple[Any, ...]] = {}

    @app.task(name="probe")
    async def probe(n: int, ctx: aqw.Context) -> None:
        assert ctx.lease is not None
        seen[ctx.job_id] = (n, ctx.attempt, ctx.fencing_token, ctx.lease.held, ctx.task)

    ids = [await probe.enqueue(n) for n in range(3)]
    await run_burst(app)
    assert sorted(seen) == sorted(ids)
    for n, job_id in enumerate(ids):
        value, attempt, fence, held, task = seen[job_id]
        assert (value, attempt, held, task) == (n, 1, True, "probe")
        assert fence > 0
    assert len({v[2] for v in seen.values()}) == 3


async def test_burst_mode_exits(backend: Backend) -> None:
    app = backend.app()
    done: list[int] = []

    @app.task
    async def quick(n: int) -> None:
        done.append(n)

    await run_burst(app, within=10)  # an empty queue: it stops by itself
    await quick.enqueue_many(list(range(20)))
    await run_burst(app, within=10)
    assert sorted(done) == list(range(20))


# -- crash recovery -------------------------------------------------------------------------------


async def _ghost_takes_everything(backend: Backend, app: aqw.App) -> int:
    """A consumer reads the waiting entries and vanishes without acking."""
    await app.broker.connect()
    if backend.raw is not None:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        stream = broker.keys.stream
        reply: Any = await backend.raw.xreadgroup("aqw", "ghost", {stream: ">"}, count=100)
        return len(reply[0][1]) if reply else 0
    ghost = MemoryBroker(app.queue)
    await ghost.start_consuming("ghost")
    return len(await ghost.fetch(100, 0))


async def test_entries_of_a_vanished_consumer_are_reclaimed_and_run_once(
    backend: Backend,
) -> None:
    app = backend.app(lease_ttl=0.5)
    runs: Counter[str] = Counter()

    @app.task
    async def work(n: int, ctx: aqw.Context) -> None:
        runs[ctx.job_id] += 1

    ids = [await work.enqueue(n) for n in range(3)]
    assert await _ghost_takes_everything(backend, app) == 3
    taken_at = time.monotonic()
    assert await depth(app) == (0, 3, 0, 0)
    async with running(app.worker(concurrency=5)) as worker:
        await eventually(lambda: worker.stats.processed == 3, 10, "the reclaimed jobs")
        reclaimed_after = time.monotonic() - taken_at
        await asyncio.sleep(1.0)  # time for a wrong second reclaim
    assert runs == Counter(ids)
    assert reclaimed_after >= 0.5  # not before the entries were idle longer than the lease ttl
    assert worker.stats.processed == 3
    assert await depth(app) == (0, 0, 0, 0)
    await assert_stream_empty(backend, app)


async def test_a_live_holder_past_its_ttl_keeps_its_job(backend: Backend) -> None:
    runs: list[str] = []
    began = asyncio.Event()

    def register(app: aqw.App) -> None:
        @app.task(name="long")
        async def long(ctx: aqw.Context) -> None:
            runs.append(ctx.worker.name)
            began.set()
            await asyncio.sleep(3 * ttl)  # past its lease ttl three times over

    # A ttl a loaded machine's stalls fit in (renewals every ttl/3): 0.5 s lost its lease.
    ttl = 1.0
    first, second = backend.app(lease_ttl=ttl), backend.app(lease_ttl=ttl)
    register(first)
    register(second)
    await first.tasks["long"].enqueue()
    async with running(first.worker(concurrency=2)) as holder:
        await asyncio.wait_for(began.wait(), 5)
        async with running(second.worker(concurrency=2)) as other:
            await eventually(lambda: holder.stats.processed == 1, 15, "the long job")
            await asyncio.sleep(0.5)
    assert runs == [holder.name]
    busy = other.stats
    assert (busy.processed, busy.failed, busy.lease_busy, busy.lease_lost) == (0, 0, 0, 0)
    assert holder.stats.lease_lost == 0
    assert await depth(first) == (0, 0, 0, 0)


# -- malformed messages ----------------------------------------------------------------------------


async def test_malformed_messages_are_dead_lettered_and_good_jobs_flow(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    done: Counter[int] = Counter()

    @app.task(name="work")
    async def work(n: int) -> None:
        done[n] += 1

    bad: dict[str, tuple[bytes, str, str]] = {
        # name: (raw "j" value, error type, readable reason)
        "not json": (b"this is not json", "MalformedJob", "invalid job envelope"),
        "bad utf-8": (b"\xff\xfe\xfa{}", "MalformedJob", "not valid UTF-8"),
        "not an object": (b"[1, 2, 3]", "MalformedJob", "invalid job envelope"),
        "no task": (b'{"v": 1, "id": "x1"}', "MalformedJob", "task: Field required"),
        "unknown task": (
            aqw.Job(task="nope", payload=1).encode(),
            "UnknownTask",
            "unknown task 'nope'",
        ),
        "wrong payload": (
            aqw.Job(task="work", payload={"n": [1]}).encode(),
            "ValidationError",
            "payload failed validation",
        ),
        "newer envelope": (
            b'{"v": 2, "task": "work", "payload": 1}',
            "MalformedJob",
            "invalid job envelope",
        ),
    }
    await app.broker.connect()
    for i in range(60):
        if i % 8 == 5:
            raw = list(bad.values())[i // 8][0]
            if backend.raw is not None:
                broker = app.broker
                assert isinstance(broker, RedisBroker)
                await backend.raw.xadd(broker.keys.stream, {"j": raw})
            else:
                broker = app.broker
                assert isinstance(broker, MemoryBroker)
                await broker.publish_raw(raw)
        await work.enqueue(i)
    expected = dict(bad)
    if backend.raw is not None:  # an entry without the "j" field at all
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await backend.raw.xadd(broker.keys.stream, {"something": "else"})
        expected["no j field"] = (b"{'something': b'else'}", "MalformedJob", "invalid job envelope")
    worker = await run_burst(app)
    assert done == Counter(range(60))
    dead = await app.dlq.list()
    assert len(dead) == len(expected)
    by_data = {d.data: d for d in dead}
    for name, (raw, error_type, reason) in expected.items():
        entry = by_data.get(raw)
        assert entry is not None, f"{name}: not in the DLQ ({list(by_data)})"
        assert entry.error_type == error_type, name
        assert reason in entry.error, f"{name}: {entry.error!r}"
    assert worker.stats.processed == 60
    assert worker.stats.dead == len(expected)
    assert await depth(app) == (0, 0, 0, len(expected))
    await assert_stream_empty(backend, app)


# -- shutdown and burst edge cases ----------------------------------------------------------------


class _LaggingPromoter(MemoryBroker):
    """The worker's own promote loop never gets through (as if each of its round trips were
    slow); any other caller of promote_due works normally."""

    async def promote_due(self) -> float | None:
        task = asyncio.current_task()
        if task is not None and task.get_name() == "aqw-promote":
            await asyncio.Event().wait()
        return await super().promote_due()


async def test_burst_does_not_stop_when_the_check_itself_promotes_a_job(queue_name: str) -> None:
    """Regression: the emptiness check's own promote_due() call moved the last delayed job
    into the queue and returned None (nothing left delayed), and the burst stopped."""
    app = aqw.App(_LaggingPromoter(queue_name))
    runs = 0

    @app.task
    async def later() -> None:
        nonlocal runs
        runs += 1

    await later.enqueue(delay=0.3)  # due before the burst's first emptiness check (~0.5 s)
    await run_burst(app, within=10)
    assert runs == 1
    assert await depth(app) == (0, 0, 0, 0)


@pytest.fixture
async def slow_link(private_redis: PrivateRedis) -> Any:
    proxy = await TcpProxy("127.0.0.1", private_redis.port).start()
    try:
        yield proxy
    finally:
        await proxy.aclose()


async def test_stop_waits_for_the_ack_of_a_finished_job(
    slow_link: TcpProxy, private_redis: PrivateRedis, queue_name: str
) -> None:
    from redis.asyncio import Redis

    app = aqw.App(slow_link.url, queue=queue_name, lease_ttl=5.0)
    observer = Redis.from_url(private_redis.url)
    finished = asyncio.Event()

    @app.task
    async def quick() -> None:
        finished.set()

    # the ack (and only the ack) takes a second to reach Redis
    slow_link.slow = (_scripts.load("ack").sha.encode(), 1.0)

    try:
        await quick.enqueue()
        worker = app.worker(grace=0.1)
        await worker.start()
        await asyncio.wait_for(finished.wait(), 10)
        await worker.stop()  # the handler is done: only its ack is on the way
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        pending = (await observer.xpending(broker.keys.stream, "aqw"))["pending"]
        assert (worker.stats.processed, pending) == (1, 0)
    finally:
        slow_link.slow = None
        await app.close()
        await observer.aclose()


async def test_stop_waits_for_the_dead_lettering_of_a_malformed_message(
    slow_link: TcpProxy, private_redis: PrivateRedis, queue_name: str
) -> None:
    from redis.asyncio import Redis

    app = aqw.App(slow_link.url, queue=queue_name, lease_ttl=5.0)
    observer = Redis.from_url(private_redis.url)

    @app.task
    async def noop() -> None:
        pass

    try:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await broker.connect()
        await observer.xadd(broker.keys.stream, {"j": b"not json"})
        worker = app.worker(grace=1.0)
        await worker.start()
        await eventually(lambda: worker.stats.malformed == 1, 10, "the malformed message")
        slow_link.latency = 0.6
        await worker.stop()
        assert worker.stats.dead == 1
        assert await observer.xlen(broker.keys.dlq) == 1
    finally:
        slow_link.latency = 0.0
        await app.close()
        await observer.aclose()
