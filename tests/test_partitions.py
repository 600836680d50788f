"""Partitioned queues (``aqw.brokers.PartitionedBroker``): one queue over several streams,
on fakeredis and on the real Redis (the broker contract runs on them too,
tests/brokers/test_contract.py; the spread over a real cluster's masters is in
tests/test_cluster.py).

What must hold: every job runs once; jobs without a route are dealt to the partitions in
turn; a key keeps its jobs in one partition, so idempotency keys, debounce and per-key caps
act as on one stream; a worker reads every partition, fairly, and an idle one wakes for a
job in any; lookups by id, depth, stats and the DLQ cover every partition.
"""

from __future__ import annotations

import asyncio
import collections
import statistics
import time
from collections.abc import AsyncIterator

import pytest
from conftest import PARTITIONS, Backend, open_backend
from pydantic import BaseModel

import aqw
from aqw._ids import new_job_id
from aqw.brokers import from_url, with_partitions
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import PartitionedBroker, RedisBroker
from aqw.brokers.redis._partitions import named, partition_of_route, split_name
from aqw.dashboard._pages import ENTRY_ID
from aqw.flow import flow_control, route_key
from aqw.status import gather_status
from tests._helpers import REDIS_URL, eventually

pytestmark = pytest.mark.timeout(60)


class Order(BaseModel):
    user: str
    n: int = 0


@pytest.fixture(
    params=["fakeredis-partitioned", pytest.param("redis-partitioned", marks=pytest.mark.redis)]
)
async def parts(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    """A queue over ``PARTITIONS`` partitions, on fakeredis and on the real Redis."""
    async with open_backend(request.param, queue_name) as b:
        yield b


def partition(job_id: str) -> int:
    p = split_name(job_id, PARTITIONS)[1]
    assert p is not None, f"{job_id!r} names no partition"
    return p


def broker_of(app: aqw.App) -> PartitionedBroker:
    assert isinstance(app.broker, PartitionedBroker)
    return app.broker


async def stream_lengths(b: Backend) -> list[int]:
    assert b.raw is not None
    return [int(await b.raw.xlen(f"aqw:{{{b.queue}:{p}}}:stream")) for p in range(PARTITIONS)]


async def test_jobs_are_dealt_in_turn_and_each_runs_once(parts: Backend) -> None:
    app = parts.app()
    runs: collections.Counter[int] = collections.Counter()

    @app.task()
    async def work(n: int) -> None:
        runs[n] += 1

    ids = list(await work.enqueue_many(list(range(150))))
    ids += [await work.enqueue(150 + i) for i in range(30)]
    per_partition = collections.Counter(partition(i) for i in ids)
    assert sorted(per_partition.values()) == [60, 60, 60]  # in turn: none ahead by more than 1
    assert await stream_lengths(parts) == [60, 60, 60]
    depth = await app.broker.depth()
    assert (depth.waiting, depth.in_flight, depth.delayed, depth.dead) == (180, 0, 0, 0)

    await app.worker(concurrency=20, burst=True).run()
    assert runs == collections.Counter(range(180)), "every job once"
    depth = await app.broker.depth()
    assert (depth.waiting, depth.in_flight, depth.delayed, depth.dead) == (0, 0, 0, 0)
    assert (await app.broker.stats())["processed"] == 180
    info = await app.job(ids[-1])
    assert info is not None and info.state == "succeeded" and info.id == ids[-1]
    status = await gather_status(app)
    assert status["depth"] == {"waiting": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    assert status["problems"] == []


async def test_a_key_keeps_its_jobs_in_one_partition(parts: Backend) -> None:
    app = parts.app()

    @app.task()
    async def plain(o: Order) -> None:
        return None

    @app.task(concurrency_key=lambda o: o.user, max_per_key=1)
    async def capped(o: Order) -> None:
        return None

    @app.task(rate_limit="1000/s")
    async def limited(o: Order) -> None:
        return None

    @app.task(rate_limit="1000/s", rate_key=lambda o: o.user)
    async def per_user(o: Order) -> None:
        return None

    # An idempotency key: the second enqueue finds the first, in the key's partition.
    first = await plain.enqueue(Order(user="a"), key="order-1")
    again = await plain.enqueue(Order(user="b"), key="order-1")
    assert (again, again.duplicate) == (first, True)
    assert partition(first) == partition_of_route("key:order-1", PARTITIONS)

    # A debounce key: a burst is one job.
    bursts = [await plain.enqueue(Order(user="c", n=i), key="d", debounce=30) for i in range(5)]
    assert len(set(bursts)) == 1

    # Each user's capped or per-user-rated jobs together; the users spread out.
    for task in (capped, per_user):
        where: dict[str, set[int]] = collections.defaultdict(set)
        for i in range(40):
            user = f"u{i % 8}"
            where[user].add(partition(await task.enqueue(Order(user=user, n=i))))
        assert all(len(p) == 1 for p in where.values()), where
        assert len({p for ps in where.values() for p in ps}) > 1, "the users spread out"

    # A task-wide rate limit has one bucket: the whole task in one partition.
    limited_ids = [await limited.enqueue(Order(user=f"u{i}")) for i in range(12)]
    assert {partition(i) for i in limited_ids} == {partition_of_route("task:" + limited.name, 3)}

    # Unkeyed jobs are dealt in turn.
    assert len({partition(await plain.enqueue(Order(user="x"))) for _ in range(3)}) == 3


async def test_a_per_key_cap_holds_across_partitions(parts: Backend) -> None:
    app = parts.app()
    running: collections.Counter[str] = collections.Counter()
    most: collections.Counter[str] = collections.Counter()
    done: list[int] = []

    @app.task(concurrency_key=lambda o: o.user, max_per_key=1)
    async def one_at_a_time(o: Order) -> None:
        running[o.user] += 1
        most[o.user] = max(most[o.user], running[o.user])
        await asyncio.sleep(0.01)
        running[o.user] -= 1
        done.append(o.n)

    await one_at_a_time.enqueue_many([Order(user=f"u{i % 4}", n=i) for i in range(40)])
    await app.worker(concurrency=16, burst=True).run()
    assert sorted(done) == list(range(40))
    assert set(most.values()) == {1}, f"two jobs of one key overlapped: {most}"


async def test_lookups_by_id_and_the_dlq_cover_every_partition(parts: Backend) -> None:
    app = parts.app(keep_for=60)

    @app.task(max_retries=0)
    async def fails(n: int) -> None:
        raise ValueError(f"bad {n}")

    ids = list(await fails.enqueue_many(list(range(7))))
    later = await fails.enqueue(99, delay=60)
    await app.worker(concurrency=4, burst=True).run()

    dead = await app.dlq.list()
    assert len(dead) == 7 and await app.dlq.count() == 7
    assert {d.job_id for d in dead} == set(ids)
    assert all(ENTRY_ID.match(d.id) for d in dead), [d.id for d in dead]
    order = [
        (
            int(d.id.split("-")[0]),
            int(d.id.split("-")[1][: d.id.index("~") - len(d.id)]),
            partition(d.id),
        )
        for d in dead
    ]
    assert order == sorted(order), "oldest first over the partitions"
    # Pages of 2 through the merged list: each entry once, in the same order.
    paged, after = [], None
    while batch := await app.broker.dlq_list(2, after):
        paged += batch
        after = batch[-1].id
    assert [d.id for d in paged] == [d.id for d in dead]

    # A job's record names its DLQ entry; the entry is found by that id.
    info = await app.job(ids[3])
    assert info is not None and info.state == "dead" and info.dlq_entry
    entry = await app.dlq.get(info.dlq_entry)
    assert entry is not None and entry.job_id == ids[3]
    assert partition(info.dlq_entry) == partition(ids[3])

    # Replay one (back to its own partition), purge the rest.
    assert await app.dlq.replay([info.dlq_entry]) == 1
    replayed = await app.job(ids[3])
    assert replayed is not None and replayed.state == "queued"
    assert (await stream_lengths(parts))[partition(ids[3])] == 1
    assert await app.dlq.purge(older_than=0) == 6
    assert await app.dlq.count() == 0

    # Cancel by id, in the delayed set of its partition.
    assert await app.cancel(later) == "cancelled"
    cancelled = await app.job(later)
    assert cancelled is not None and cancelled.state == "cancelled"
    assert await app.cancel(named("nope", 1)) == "unknown"
    assert await app.job("nope") is None


async def test_a_job_built_by_hand_is_found_by_its_own_id(parts: Backend) -> None:
    """A ``Job`` published with an id that names no partition goes where its key (else its
    id) hashes to, and lookups by that id find it."""
    app = parts.app()
    broker = broker_of(app)
    await broker.connect()
    jobs = [aqw.Job(task="t", payload=i) for i in range(6)]
    keyed = aqw.Job(task="t", payload=0, key="k1")
    await broker.publish([*jobs, keyed])
    for job in [*jobs, keyed]:
        info = await app.job(job.id)
        assert info is not None and info.state == "queued", job.id
    assert broker.partition_of(keyed) == partition_of_route("k1", PARTITIONS)
    assert sum(await stream_lengths(parts)) == 7


async def test_one_fetch_takes_from_every_partition(parts: Backend) -> None:
    """A backlog in one partition does not hold back the jobs of the others."""
    app = parts.app()
    broker = broker_of(app)
    await broker.connect()
    await broker.start_consuming("c1")
    backlog = [aqw.Job(id=named(new_job_id(), 0), task="t") for _ in range(300)]
    few = [aqw.Job(id=named(new_job_id(), 2), task="t") for _ in range(4)]
    await broker.publish(backlog)
    await broker.publish(few)
    got = await broker.fetch(30, block=0)
    assert len(got) == 30
    assert collections.Counter(partition(d.id) for d in got)[2] == 4
    # Entry ids repeat across streams; the deliveries' ids name their partition.
    assert len({d.id for d in got}) == 30
    # And settling acts on the partition it came from.
    for d in got:
        assert await broker.give_back(d, None)
    assert sum(await stream_lengths(parts)) == 304


async def test_an_idle_worker_wakes_for_a_job_in_any_partition(parts: Backend) -> None:
    """One blocking read over every partition: a job is picked up at once, not at the next
    poll (the worker's read blocks up to 2 s, so polling would take ~1 s on average)."""
    app = parts.app()
    started: dict[str, float] = {}

    @app.task()
    async def note(tag: str) -> None:
        started[tag] = time.monotonic()

    waits = []
    async with app.worker(concurrency=4):
        await asyncio.sleep(0.3)  # idle, blocked in its read
        for i in range(PARTITIONS * 2):
            sent = time.monotonic()
            job_id = await note.enqueue(f"j{i}")
            await eventually(lambda i=i: f"j{i}" in started, 10, "the job to start")
            waits.append(started[f"j{i}"] - sent)
            assert partition(job_id) in range(PARTITIONS)
    assert statistics.median(waits) < 0.5, waits


async def test_partitions_options_fail_fast_and_keep_across_rebinding() -> None:
    with pytest.raises(aqw.ConfigError, match="partitions must be an integer"):
        aqw.App(REDIS_URL, partitions=0)
    with pytest.raises(aqw.ConfigError, match="partitions must be an integer"):
        from_url(REDIS_URL + "?partitions=lots")
    with pytest.raises(aqw.ConfigError, match="only a Redis queue is partitioned"):
        from_url("sqs://q?region=us-east-1", partitions=2)
    app = aqw.App(f"{REDIS_URL}?partitions=4&queue=pq")
    assert isinstance(app.broker, PartitionedBroker) and app.broker.partitions == 4
    assert app.queue == "pq" and app.broker.describe().endswith("queue=pq partitions=4")
    assert isinstance(app.broker_for("other"), PartitionedBroker)
    await app.close()

    app = aqw.App("memory://", partitions=4)  # one process: nothing to spread
    assert isinstance(app.broker, MemoryBroker)
    app = aqw.App(REDIS_URL, partitions=3)
    app.use_broker(REDIS_URL, queue="q2")  # what `aqw --broker` does keeps the partitions
    assert isinstance(app.broker, PartitionedBroker) and app.broker.partitions == 3
    await app.close()
    plain = RedisBroker(REDIS_URL, "q3")
    wrapped = with_partitions(plain, 2)
    assert isinstance(wrapped, PartitionedBroker) and wrapped.client is plain.client
    assert with_partitions(plain, 1) is plain
    with pytest.raises(aqw.ConfigError, match="has 2"):
        with_partitions(wrapped, 3)
    await plain.close()


def test_ids_name_their_partition_and_nothing_else_does() -> None:
    assert split_name(named("abc", 2), 3) == ("abc", 2)
    assert split_name(named("abc", 5), 3) == (named("abc", 5), None)  # not a partition here
    assert split_name("order~pizza", 3) == ("order~pizza", None)
    assert split_name("1-0", 3) == ("1-0", None)
    assert ENTRY_ID.match("1700000000000-3~p2") and not ENTRY_ID.match("1-0~px")
    capped = flow_control("t", concurrency_key=str, max_per_key=2)
    assert route_key("t", capped, "u1", "k", "g") == "cap:t:u1"
    assert route_key("t", flow_control("t", rate_limit="5/s"), "u1", "k", "g") == "task:t"
    assert route_key("t", flow_control("t"), "u1", "k", "g") == "key:k"
    assert route_key("t", flow_control("t"), "u1", None, "g") == "group:g"
    assert route_key("t", flow_control("t"), "u1", None, None) is None
