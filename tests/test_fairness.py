"""Fair shares between tenants (issue 28): a job's fairness key and weight, picked across the
keys with jobs waiting by start-time fair queueing in the fetch step. The starvation bound
and the weights are counted (picks, starts), never timed. On memory, fakeredis and Redis;
three worker processes on the real Redis; other brokers refuse in one line."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend
from redis.asyncio import Redis

import aqw
from aqw.brokers.base import Broker
from aqw.job import Job
from tests._helpers import REDIS_URL, eventually, require_real_redis, run_burst
from tests._spawn import spawn_script
from tests.brokers.conftest import (  # noqa: F401 - the SQS fixtures, used by name
    SQSKit,
    new_app,
    sqs,
    sqs_endpoint,
)

pytestmark = pytest.mark.timeout(120)


def tenant_task(app: aqw.App, **options: Any) -> Any:
    @app.task(name="tenant_job", fairness_key=lambda p: p["tenant"], **options)
    async def tenant_job(p: dict[str, Any]) -> None: ...

    return tenant_job


async def picks(broker: Broker, n: int, count: int = 1) -> list[str]:
    """The fairness keys of the next ``n`` jobs fetched, ``count`` per fetch, unsettled."""
    out: list[str] = []
    while len(out) < n:
        got = await broker.fetch(min(count, n - len(out)), 0)
        if not got:
            break
        out += [str(Job.decode(d.data).fairness_key) for d in got]
    return out


async def flood(task: Any, tenant: str, n: int, **extra: Any) -> None:
    for start in range(0, n, 5000):
        payloads = [{"tenant": tenant, "n": i, **extra} for i in range(start, min(n, start + 5000))]
        await task.enqueue_many(payloads)


# -- the starvation bound ------------------------------------------------------------------


async def test_a_new_tenant_is_among_the_next_active_keys_picks(backend: Backend) -> None:
    """Tenant A holds 100,000 jobs (20,000 in memory, 2,000 on fakeredis), eight more tenants
    50 each; B's one job is among the next (active keys) = 10 picks after its enqueue, the
    bound with k = 1."""
    app = backend.app()
    task = tenant_task(app)
    await flood(task, "A", {"fakeredis": 2_000, "memory": 20_000}.get(backend.kind, 100_000))
    for c in range(8):
        await flood(task, f"C{c}", 50)
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    before = await picks(app.broker, 37, count=10)  # a turn well under way
    assert set(before) == {"A", *(f"C{c}" for c in range(8))}
    await task.enqueue({"tenant": "B", "n": 0})
    after = await picks(app.broker, 10)
    assert "B" in after, after
    # and B is no more favoured than a key that was waiting: one job, one turn
    assert after.count("B") == 1


async def test_a_tenant_that_ran_dry_does_not_cut_in_when_it_comes_back(
    backend: Backend,
) -> None:
    """A key that leaves and comes back keeps the tag it left with: enqueueing one job at a
    time right after each pick gets a key its share, not every pick."""
    app = backend.app()
    task = tenant_task(app)
    await flood(task, "A", 200)
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    order: list[str] = []
    for n in range(40):
        await task.enqueue({"tenant": "B", "n": n})
        order += await picks(app.broker, 1)
    counts = collections.Counter(order)
    assert abs(counts["A"] - counts["B"]) <= 2, order


async def test_weights_hold_within_5_percent_over_10000_starts(backend: Backend) -> None:
    app = backend.app()
    task = tenant_task(app, fairness_weight=lambda p: p["w"])
    n = 2_000 if backend.kind == "fakeredis" else 10_000
    for tenant, weight in (("x", 1), ("y", 2), ("z", 5)):
        await flood(task, tenant, n, w=weight)
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    counts = collections.Counter(await picks(app.broker, n, count=100))
    assert sum(counts.values()) == n
    for tenant, weight in (("x", 1), ("y", 2), ("z", 5)):
        expected = n * weight / 8
        assert abs(counts[tenant] - expected) <= 0.05 * expected, counts


async def test_jobs_already_started_count_toward_their_keys_share(backend: Backend) -> None:
    """A key is charged at the pick: jobs fetched and still running are its share (no key
    gets more slots because its earlier jobs have not finished)."""
    app = backend.app()
    task = tenant_task(app)
    await flood(task, "A", 30)
    await flood(task, "B", 30)
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    held = await picks(app.broker, 10, count=10)  # fetched, never settled
    assert collections.Counter(held) == {"A": 5, "B": 5}
    more = await picks(app.broker, 10, count=3)
    assert collections.Counter(more) == {"A": 5, "B": 5}


async def test_enqueue_names_the_key_and_weight_over_the_tasks(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="job")
    async def job(n: int) -> None: ...

    await job.enqueue_many(list(range(20)), fairness_key="acme", fairness_weight=3)
    await job.enqueue_many(list(range(20)), fairness_key="zed")
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    counts = collections.Counter(await picks(app.broker, 8, count=8))
    assert counts == {"acme": 6, "zed": 2}


# -- with priorities and the plain path ----------------------------------------------------


async def test_a_higher_level_still_comes_first_and_plain_jobs_keep_their_order(
    backend: Backend,
) -> None:
    app = backend.app()
    task = tenant_task(app)

    @app.task(name="plain")
    async def plain(n: int) -> None: ...

    await flood(task, "A", 5)
    await task.enqueue({"tenant": "B", "n": 0}, priority=3)
    await plain.enqueue(1, priority=5)
    await plain.enqueue(2)
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    got = await app.broker.fetch(10, 0)
    jobs = [Job.decode(d.data) for d in got]
    assert [(j.priority, j.fairness_key) for j in jobs] == [
        (5, None),
        (3, "B"),
        (0, None),  # the level's stream first, then the level's fair turns fill the fetch
        *[(0, "A")] * 5,
    ]


async def test_fair_jobs_run_to_the_end_on_a_worker(backend: Backend) -> None:
    app = backend.app()
    ran: list[tuple[str, int]] = []

    @app.task(name="tenant_job", fairness_key=lambda p: p["tenant"], keep_result=True)
    async def tenant_job(p: dict[str, Any]) -> int:
        ran.append((p["tenant"], p["n"]))
        return int(p["n"])

    ids = [await tenant_job.enqueue({"tenant": t, "n": n}) for n in range(5) for t in "ab"]
    await run_burst(app, concurrency=1)
    assert sorted(ran) == sorted((t, n) for n in range(5) for t in "ab")
    assert ran[:4] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]  # alternating, FIFO per key
    assert await app.result(ids[-1]) == 4
    assert (await app.broker.depth()).waiting == 0


async def test_a_queue_without_fairness_keys_keeps_its_layout(redis_backend: Backend) -> None:
    app = redis_backend.app()

    @app.task(name="plain")
    async def plain(n: int) -> None: ...

    await plain.enqueue_many(list(range(5)))
    await plain.enqueue(5)
    await run_burst(app)
    assert redis_backend.raw is not None
    keys = [k async for k in redis_backend.raw.scan_iter(f"aqw:{{{app.queue}}}:fair*", count=1000)]
    assert keys == []
    assert await redis_backend.raw.smembers(f"aqw:{{{app.queue}}}:levels") == set()
    assert b"fairness" not in Job(task="plain").encode()


# -- refusals ------------------------------------------------------------------------------


async def test_bad_fairness_options_are_refused_in_one_line(backend: Backend) -> None:
    app = backend.app()
    with pytest.raises(aqw.ConfigError, match="task 't1': fairness_weight must be a number"):
        app.task(name="t1", fairness_key="k", fairness_weight=0)(_noop)
    with pytest.raises(aqw.ConfigError, match="task 't2': fairness_key must be a function"):
        app.task(name="t2", fairness_key=3)(_noop)
    with pytest.raises(aqw.ConfigError, match="fairness_weight needs a fairness_key"):
        app.task(name="t3", fairness_weight=2)(_noop)

    @app.task(name="job", fairness_key=lambda p: "k", fairness_weight=lambda p: p)
    async def job(n: float) -> None: ...

    with pytest.raises(aqw.ConfigError, match="fairness_weight must be a number"):
        await job.enqueue(-1.0)
    with pytest.raises(aqw.ConfigError, match="fairness_key does not go with key="):
        await job.enqueue(1.0, key="once")
    with pytest.raises(aqw.ConfigError, match="fairness_key does not go with delay="):
        await job.enqueue(1.0, delay=5)
    with pytest.raises(aqw.ConfigError, match="fairness_key must be a string"):
        await job.enqueue(1.0, fairness_key="")
    assert (await app.broker.depth()).waiting == 0  # nothing written


async def _noop() -> None: ...


async def test_sqs_refuses_fairness_keys_and_says_what_to_do(
    sqs: SQSKit,  # noqa: F811
    new_app: Any,  # noqa: F811
) -> None:
    url = await sqs.create("fair")
    task = tenant_task(new_app(sqs.url("fair")))
    with pytest.raises(aqw.ConfigError, match=r"the aws_sqs broker does not.*group_key"):
        await task.enqueue({"tenant": "a", "n": 1})
    assert await sqs.count(url) == 0


async def test_a_partitioned_queue_refuses_fairness_keys(queue_name: str) -> None:
    from aqw.brokers.redis import PartitionedBroker

    require_real_redis()
    app = aqw.App(PartitionedBroker(REDIS_URL, queue_name, 2))
    try:
        with pytest.raises(aqw.ConfigError, match="fairness_key needs a broker"):
            await tenant_task(app).enqueue({"tenant": "a", "n": 1})
    finally:
        await app.close()


# -- three worker processes on the real Redis ----------------------------------------------

SCRIPT = Path(__file__).resolve().parent / "fair_worker.py"


@pytest.mark.slow
async def test_three_processes_start_a_new_tenant_within_the_bound(
    queue_name: str, tmp_path: Path
) -> None:
    """3 worker processes (concurrency 2, no prefetch) drain tenant A's 3,000 jobs; B's one
    job starts within (the jobs the workers held when B arrived: 3 x 2) + (active keys: 2)
    starts after its enqueue: counted in the workers' ledger of starts."""
    from tests.test_rate_limits import env_for_workers, stop_workers

    require_real_redis()
    client = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue_name)
    task = tenant_task(app)
    ledger = f"aqw:{{{queue_name}}}:ledger"
    await flood(task, "A", 3_000)
    env = env_for_workers(SCRIPT.parent.parent)
    procs = []
    for i in range(3):
        with (tmp_path / f"worker-{i}.log").open("wb") as log:
            procs.append(await spawn_script(SCRIPT, queue_name, env=env, log=log))
    try:
        await eventually(lambda: client.llen(ledger), 60, "starts", interval=0.05, procs=procs)
        await eventually(
            lambda: _at_least(client, ledger, 200), 60, "200 starts", interval=0.05, procs=procs
        )
        # The workers are frozen while the ledger is counted and B enqueued: no start can
        # fall between the count and the enqueue (on a loaded machine several did), so the
        # starts counted after it are exactly those after B's arrival.
        for proc in procs:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            seen = await _settled_length(client, ledger)
            await task.enqueue({"tenant": "B", "n": 0})
        finally:
            for proc in procs:
                os.kill(proc.pid, signal.SIGCONT)
        await eventually(
            lambda: _has_b(client, ledger), 60, "B's start", interval=0.05, procs=procs
        )
        entries = [e.decode() for e in await client.lrange(ledger, 0, -1)]  # type: ignore[misc]
    finally:
        await stop_workers(procs)
        await app.close()
        await client.aclose()
    where = next(i for i, e in enumerate(entries) if e.startswith("B "))
    assert where - seen < 3 * 2 + 2, (where, seen)
    assert len({e.split()[2] for e in entries}) == 3  # the processes shared the work


@pytest.mark.slow
async def test_three_processes_hold_the_weights_within_5_percent(
    queue_name: str, tmp_path: Path
) -> None:
    """3 worker processes drain x (weight 1) and y (weight 3), 4,000 jobs each: of the first
    4,000 starts (both keys waiting all along) y has 3/4, within 5%."""
    from tests.test_rate_limits import env_for_workers, stop_workers

    require_real_redis()
    client = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue_name)
    task = tenant_task(app, fairness_weight=lambda p: p["w"])
    ledger = f"aqw:{{{queue_name}}}:ledger"
    await flood(task, "x", 4_000, w=1)
    await flood(task, "y", 4_000, w=3)
    env = env_for_workers(SCRIPT.parent.parent)
    procs = []
    for i in range(3):
        with (tmp_path / f"worker-{i}.log").open("wb") as log:
            procs.append(await spawn_script(SCRIPT, queue_name, env=env, log=log))
    try:
        await eventually(lambda: _at_least(client, ledger, 4_000), 120, "4,000 starts", procs=procs)
        entries = [e.decode() for e in await client.lrange(ledger, 0, 3_999)]  # type: ignore[misc]
    finally:
        await stop_workers(procs)
        await app.close()
        await client.aclose()
    counts = collections.Counter(e.split()[0] for e in entries)
    assert abs(counts["y"] - 3_000) <= 150 and abs(counts["x"] - 1_000) <= 50, counts
    assert len({e.split()[2] for e in entries}) == 3


async def _at_least(client: Redis, key: str, n: int) -> bool:
    return bool(await client.llen(key) >= n)  # type: ignore[misc]


async def _settled_length(client: Redis, key: str) -> int:
    """The list's length once it stops changing: a push a frozen worker had sent before its
    SIGSTOP still lands."""
    length = -1
    while True:
        now = int(await client.llen(key))  # type: ignore[misc]
        if now == length:
            return now
        length = now
        await asyncio.sleep(0.05)


async def _has_b(client: Redis, key: str) -> bool:
    entries = await client.lrange(key, -50, -1)  # type: ignore[misc]
    return any(e.startswith(b"B ") for e in entries)


async def test_a_worker_of_several_queues_takes_fair_jobs_in_turn(backend: Backend) -> None:
    app = backend.app()
    ran: list[str] = []
    other = f"{app.queue}-b"

    @app.task(name="tenant_job", fairness_key=lambda p: p["tenant"], queue=other)
    async def tenant_job(p: dict[str, Any]) -> None:
        ran.append(p["tenant"])

    @app.task(name="plain")
    async def plain(n: int) -> None:
        ran.append("plain")

    await flood(tenant_job, "A", 20)
    await tenant_job.enqueue({"tenant": "B", "n": 0})
    await plain.enqueue_many([1, 2])
    await run_burst(app, concurrency=1, queues=[app.queue, other])
    assert ran[:4] == ["plain", "plain", "A", "B"]  # the queues in order, then the turn
    assert len(ran) == 23


async def test_depth_and_its_history_count_the_jobs_waiting_in_turns(backend: Backend) -> None:
    import time

    app = backend.app()
    task = tenant_task(app)

    @app.task(name="plain")
    async def plain(n: int) -> None: ...

    await flood(task, "A", 7)
    await flood(task, "B", 3)
    await plain.enqueue(1)
    await app.broker.connect()
    await app.broker.start_consuming("c1")
    assert len(await picks(app.broker, 2, count=2)) == 2  # one plain job, one of the turns
    depth = await app.broker.depth()
    assert (depth.waiting, depth.in_flight) == (9, 2)
    assert app.broker.history is not None
    now = time.time()
    await app.broker.history.sample(now)
    samples = await app.broker.history.since(now - 60)
    assert [(s.waiting, s.in_flight) for s in samples] == [(9, 2)]
