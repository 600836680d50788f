"""Job priorities within a queue: levels 0-9, higher first, FIFO within a level, a share
for the lower levels, delayed jobs and retries back at their own level, crash recovery on
every level; bad levels refused; SQS refuses priorities. On memory, fakeredis and Redis."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.brokers.base import Broker, Delivery, Failure
from aqw.brokers.redis import RedisBroker
from aqw.job import Job
from tests._helpers import eventually, run_burst, running
from tests.brokers.conftest import (  # noqa: F401 - the SQS fixtures, used by name
    SQSKit,
    new_app,
    sqs,
    sqs_endpoint,
)

pytestmark = pytest.mark.timeout(60)


def keys_of(broker: Broker) -> Any:
    assert isinstance(broker, RedisBroker)
    return broker.keys


# -- order ------------------------------------------------------------------------------------


async def test_a_stopped_queue_drains_highest_level_first_fifo_within_a_level(
    backend: Backend,
) -> None:
    app = backend.app()
    ran: list[int] = []

    @app.task(name="job")
    async def job(n: int) -> None:
        ran.append(n)

    rng = random.Random(7)
    levels = [rng.randint(0, 9) for _ in range(50)]
    for n, level in enumerate(levels[:40]):
        await job.enqueue(n, priority=level)
    for n, level in enumerate(levels[40:], start=40):  # enqueue_many and app.enqueue too
        if n % 2:
            await job.enqueue_many([n], priority=level)
        else:
            await app.enqueue("job", [n], priority=level)
    assert (await app.broker.depth()).waiting == 50

    await run_burst(app, concurrency=1, priority_share=0)

    assert sorted(ran) == list(range(50))
    by_level = [(levels[n], n) for n in ran]
    assert by_level == sorted(by_level, key=lambda x: (-x[0], x[1]))


async def test_the_task_default_and_an_enqueue_override(backend: Backend) -> None:
    app = backend.app()
    ran: list[str] = []

    @app.task(name="urgent", priority=8)
    async def urgent(tag: str) -> None:
        ran.append(tag)

    await urgent.enqueue("low", priority=0)
    await urgent.enqueue("default")  # the task's 8
    await urgent.enqueue("top", priority=9)
    await run_burst(app, concurrency=1, priority_share=0)
    assert ran == ["top", "default", "low"]


async def test_high_jobs_behind_a_low_backlog_start_before_any_further_low_one(
    backend: Backend,
) -> None:
    """1,000 low jobs waiting and a worker running them; then 10 high ones, at a level this
    queue has never used: once the enqueue returns, no low job starts before the last high
    one but those the worker already held (its slots and one fetch on its way)."""
    app = backend.app()
    starts: list[str] = []
    concurrency = 4

    @app.task(name="low")
    async def low(n: int) -> None:
        starts.append("low")
        await asyncio.sleep(0.001)

    @app.task(name="high")
    async def high(n: int) -> None:
        starts.append("high")

    producer = backend.app()  # another process: the worker's broker has not seen level 7
    producer.task(name="high")(high.fn)
    await low.enqueue_many(list(range(1000)))
    async with running(app.worker(concurrency=concurrency, priority_share=0)):
        await eventually(lambda: len(starts) >= 50, 20, "50 low jobs started")
        await producer.enqueue("high", list(range(10)), priority=7)
        mark = len(starts)
        await eventually(lambda: starts.count("high") == 10, 20, "the 10 high jobs started")
        last_high = max(i for i, s in enumerate(starts) if s == "high")
    assert starts.count("low") < 1000, "the backlog drained before the high jobs were read"
    held = 2 * concurrency  # in the slots, and one fetch on its way
    assert starts[mark:last_high].count("low") <= held, starts[mark : last_high + 1]


async def _run_against_a_steady_high_stream(backend: Backend, share: float) -> tuple[int, int]:
    """A running worker (concurrency 1) and a high level that never empties: each high job
    enqueues the next before it ends, on top of a backlog. (high jobs run, low jobs run)
    once 60 high jobs have run."""
    app = backend.app()
    counts = {"high": 0, "low": 0}

    @app.task(name="high")
    async def high(n: int) -> None:
        counts["high"] += 1
        await high.enqueue(n + 1, priority=9)

    @app.task(name="low")
    async def low(n: int) -> None:
        counts["low"] += 1

    await high.enqueue_many([0, 0, 0], priority=9)
    await low.enqueue_many(list(range(5)), priority=1)
    async with running(app.worker(concurrency=1, priority_share=share)):
        await eventually(lambda: counts["high"] >= 60, 30, "60 high-priority jobs ran")
    return counts["high"], counts["low"]


async def test_a_share_lets_lower_levels_run_under_a_steady_high_stream(
    backend: Backend,
) -> None:
    high, low = await _run_against_a_steady_high_stream(backend, share=0.2)
    assert low >= 3, (high, low)  # about one fetch in five started from level 1
    assert high >= 60


async def test_strict_priority_never_runs_a_lower_level_while_the_higher_waits(
    backend: Backend,
) -> None:
    high, low = await _run_against_a_steady_high_stream(backend, share=0)
    assert (high, low) == (high, 0)


# -- delayed jobs, retries, the DLQ: back at their own level -----------------------------------


async def consumer(backend: Backend, name: str = "c") -> Broker:
    broker = backend.broker()
    await broker.connect()
    await broker.start_consuming(name)
    return broker


async def fetch_all(broker: Broker, count: int = 100, expect: int = 0) -> list[Delivery]:
    """Fetch until nothing comes, or (``expect``) until that many came: a level first used
    by another process is read once the consumer has re-read the levels (about 1 s)."""
    out: list[Delivery] = []
    deadline = time.monotonic() + 10
    while True:
        got = await broker.fetch(count, 0.05)
        out += got
        if (len(out) >= expect and not got) or time.monotonic() > deadline:
            return out


def task_of(delivery: Delivery) -> tuple[str, int]:
    job = Job.decode(delivery.data)
    return job.payload, job.priority


async def test_a_delayed_job_comes_due_at_its_own_level(backend: Backend) -> None:
    app = backend.app()
    c = await consumer(backend)
    try:
        later = time.time() + 0.05
        await app.broker.schedule([Job(task="t", payload="late", priority=3)], later)
        await app.broker.publish([Job(task="t", payload="plain")])
        if backend.is_redis:
            k, raw = keys_of(app.broker), backend.raw
            assert raw is not None
            assert (await raw.zcard(k.delayed_for(3)), await raw.zcard(k.delayed)) == (1, 0)
        await eventually(lambda: time.time() > later, 5, "the delayed job is due")
        assert await c.promote_due() is None
        got = await fetch_all(c)
        assert [(task_of(d), d.level) for d in got] == [(("late", 3), 3), (("plain", 0), 0)]
    finally:
        await c.close()


async def test_a_retry_and_a_dlq_replay_come_back_at_their_own_level(backend: Backend) -> None:
    app = backend.app()
    c = await consumer(backend)
    try:
        await app.broker.publish([Job(task="t", payload="p6", priority=6)])
        [first] = await fetch_all(c)
        assert first.level == 6
        job = Job.decode(first.data)
        assert await c.retry(first, job.next_attempt(), time.time() - 1, None)
        if backend.is_redis:
            raw = backend.raw
            assert raw is not None
            assert await raw.zcard(keys_of(app.broker).delayed_for(6)) == 1
        await app.broker.publish([Job(task="t", payload="p0")])
        await c.promote_due()
        got = await fetch_all(c)
        assert [(task_of(d), d.level) for d in got] == [(("p6", 6), 6), (("p0", 0), 0)]
        assert Job.decode(got[0].data).attempt == 2

        failure = Failure("E", "boom", failed_at=time.time())
        entry = await c.dead_letter(got[0], Job.decode(got[0].data), failure, 2, None)
        assert entry is not None and await c.ack(got[1], Job.decode(got[1].data), None)
        await app.broker.publish([Job(task="t", payload="p1", priority=1)])
        [dead] = await app.broker.dlq_list()
        assert dead.job is not None
        assert await app.broker.dlq_replay([(dead.id, dead.job)]) == 1
        got = await fetch_all(c, expect=2)
        # each at its own level (which comes first is the order tests' to check: on NATS a
        # pull request still open on level 6 from an earlier fetch may bring p6 a fetch late)
        assert sorted((task_of(d), d.level) for d in got) == [(("p1", 1), 1), (("p6", 6), 6)]
    finally:
        await c.close()


async def test_keyed_and_debounced_jobs_wait_and_run_at_their_level(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="t")
    async def t(tag: str) -> None:
        return None

    await t.enqueue("keyed", key="k1", priority=4)
    await t.enqueue("debounced", key="k2", debounce=0.05, priority=6)
    await t.enqueue("plain")
    c = await consumer(backend)
    try:
        await eventually(lambda: _all_promoted(c), 5, "the debounced job came due")
        got = await fetch_all(c, expect=3)
        assert [(task_of(d), d.level) for d in got] == [
            (("debounced", 6), 6),
            (("keyed", 4), 4),
            (("plain", 0), 0),
        ]
    finally:
        await c.close()


async def _all_promoted(broker: Broker) -> bool:
    return await broker.promote_due() is None  # None: nothing left in a delayed set


async def test_a_failing_job_retries_and_succeeds_at_its_level(backend: Backend) -> None:
    app = backend.app(retry=aqw.RetryPolicy(max_retries=3, base=0.01, cap=0.02))
    attempts: list[int] = []

    @app.task(name="flaky", priority=5)
    async def flaky(ctx: aqw.Context) -> None:
        attempts.append(ctx.job.attempt)
        assert ctx.job.priority == 5
        if ctx.job.attempt < 3:
            raise RuntimeError("not yet")

    await flaky.enqueue()
    await run_burst(app, concurrency=1)
    assert attempts == [1, 2, 3]
    assert (await app.broker.depth()).as_dict() == dict.fromkeys(
        ("waiting", "in_flight", "delayed", "dead"), 0
    )


# -- crash recovery ----------------------------------------------------------------------------


async def test_a_crashed_workers_jobs_of_every_level_are_reclaimed(backend: Backend) -> None:
    app = backend.app(lease_ttl=0.3)
    ran: list[tuple[str, int]] = []

    @app.task(name="job")
    async def job(ctx: aqw.Context, tag: str) -> None:
        ran.append((tag, ctx.job.priority))

    for level in (0, 4, 9):
        await job.enqueue(f"l{level}", priority=level)
    crashed = await consumer(backend, "crashed")
    taken = await fetch_all(crashed)  # ...and it dies, settling none of them
    assert sorted(d.level for d in taken) == [0, 4, 9]
    assert (await app.broker.depth()).in_flight == 3
    await job.enqueue("fresh", priority=2)

    async with running(app.worker(concurrency=4)):
        await eventually(lambda: len(ran) == 4, 20, "every job ran")
        await eventually(
            lambda: _drained(app.broker), 10, "nothing left waiting, in flight or delayed"
        )
    assert sorted(ran) == [("fresh", 2), ("l0", 0), ("l4", 4), ("l9", 9)]
    await crashed.close()


async def test_keep_alive_and_give_back_act_on_the_deliverys_level(backend: Backend) -> None:
    app = backend.app()
    c = await consumer(backend, "stopping")
    other = await consumer(backend, "other")
    try:
        await app.broker.publish([Job(task="t", payload=f"l{p}", priority=p) for p in (0, 4, 9)])
        taken = await fetch_all(c)
        assert [(task_of(d), d.level) for d in taken] == [
            (("l9", 9), 9),
            (("l4", 4), 4),
            (("l0", 0), 0),
        ]
        assert all([await c.keep_alive(d) for d in taken])
        assert await c.give_back_unstarted(set()) == 3  # e.g. a fetch cut short by a stop
        back = await fetch_all(other, expect=3)
        assert [(task_of(d), d.level) for d in back] == [(task_of(d), d.level) for d in taken]
        assert not any([await c.keep_alive(d) for d in taken])  # no longer c's
    finally:
        await c.close()
        await other.close()


async def _drained(broker: Broker) -> bool:
    d = await broker.depth()
    return d.waiting == d.in_flight == d.delayed == 0


# -- depth, layout ------------------------------------------------------------------------------


async def test_depth_sums_over_the_levels(backend: Backend) -> None:
    app = backend.app()
    c = await consumer(backend)
    try:
        await app.broker.publish([Job(task="t", priority=p) for p in (0, 0, 5)])
        await app.broker.publish([Job(task="t", priority=9)])
        await app.broker.schedule([Job(task="t", priority=2)], time.time() + 60)
        assert (await app.broker.depth()).as_dict() == {
            "waiting": 4,
            "in_flight": 0,
            "delayed": 1,
            "dead": 0,
        }
        got = await c.fetch(2, 0.1)
        assert sorted(d.level for d in got) == [5, 9]
        assert (await app.broker.depth()).as_dict() == {
            "waiting": 2,
            "in_flight": 2,
            "delayed": 1,
            "dead": 0,
        }
        other = backend.app()  # another process's view: it never enqueued at those levels
        assert (await other.broker.depth()).waiting == 2
    finally:
        await c.close()


async def test_a_queue_without_priorities_keeps_its_layout(redis_backend: Backend) -> None:
    app = redis_backend.app()

    @app.task(name="plain")
    async def plain(n: int) -> None:
        return None

    await plain.enqueue(1)
    await plain.enqueue_many([2, 3])
    await plain.enqueue(4, delay=60)
    raw = redis_backend.raw
    assert raw is not None
    tag = f"aqw:{{{redis_backend.queue}}}:"
    names = sorted(
        [k.decode()[len(tag) :] async for k in raw.scan_iter(match=tag + "*", count=1000)]
    )
    assert [n for n in names if not n.startswith("job:")] == ["delayed", "stream"]
    [[_, fields]] = await raw.xrange(tag + "stream", count=1)
    assert "priority" not in json.loads(fields[b"j"])

    await plain.enqueue(5, priority=3)
    assert await raw.smembers(tag + "levels") == {b"3"}
    assert await raw.xlen(tag + "stream:p3") == 1


async def test_a_level_stream_deleted_under_a_worker_is_recreated(redis_backend: Backend) -> None:
    app = redis_backend.app()
    c = await consumer(redis_backend)
    try:
        await app.broker.publish([Job(task="t", payload="a", priority=3)])
        assert [task_of(d) for d in await fetch_all(c, expect=1)] == [("a", 3)]
        raw = redis_backend.raw
        assert raw is not None
        await raw.delete(keys_of(app.broker).stream_for(3))  # its consumer group with it
        await app.broker.publish([Job(task="t", payload="b", priority=3)])
        assert [task_of(d) for d in await fetch_all(c, expect=1)] == [("b", 3)]
    finally:
        await c.close()


def test_the_envelope_of_a_job_without_a_priority_is_unchanged() -> None:
    job = Job(id="j", task="t", payload={"a": 1}, enqueued_at=1.0)
    assert job.encode() == (
        b'{"v":1,"id":"j","task":"t","payload":{"a":1},"attempt":1,"enqueued_at":1.0,'
        b'"headers":{},"key":null,"expires_at":null}'
    )
    assert Job.decode(job.encode()).priority == 0
    high = job.model_copy(update={"priority": 7})
    assert json.loads(high.encode())["priority"] == 7
    assert Job.decode(high.encode()) == high
    assert high.next_attempt().priority == 7


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 10, True, 1.5, "3"])
async def test_a_bad_priority_is_a_config_error_naming_it(backend: Backend, bad: Any) -> None:
    app = backend.app()

    @app.task(name="t")
    async def t() -> None:
        return None

    for enqueue in (
        lambda: t.enqueue(priority=bad),
        lambda: t.enqueue_many([None], priority=bad),
        lambda: app.enqueue("t", [None], priority=bad),
    ):
        with pytest.raises(aqw.ConfigError, match="enqueue: priority must be an integer 0-9"):
            await enqueue()
    with pytest.raises(aqw.ConfigError, match="task 'u': priority must be an integer 0-9"):
        app.task(name="u", priority=bad)(t.fn)
    assert (await app.broker.depth()).waiting == 0


def test_a_bad_priority_share_is_a_config_error_naming_it() -> None:
    app = aqw.App("memory://")

    @app.task
    async def t() -> None:
        return None

    for bad in (-0.1, 1.5, True, "0.1"):
        with pytest.raises(aqw.ConfigError, match="priority_share"):
            app.worker(priority_share=bad)


async def test_sqs_refuses_priorities_and_says_what_to_do(
    sqs: SQSKit,  # noqa: F811
    new_app: Any,  # noqa: F811
) -> None:
    url = await sqs.create("prio")
    app = new_app(sqs.url("prio"))

    @app.task(name="t")
    async def t(n: int) -> None:
        return None

    with pytest.raises(aqw.ConfigError, match="SQS has no message priorities") as refused:
        await t.enqueue(1, priority=5)
    assert "one queue per level" in str(refused.value) and "--queues" in str(refused.value)
    with pytest.raises(aqw.ConfigError, match="priority=2"):
        await t.enqueue_many([1, 2], priority=2, delay=5)
    await t.enqueue(3)  # the default level is no priority at all
    assert await sqs.count(url) == 1
