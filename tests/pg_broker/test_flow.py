"""Rate limits and per-key caps on the PostgreSQL broker, against the real PostgreSQL: two
workers of two apps (each a broker of its own) share one cap of one per key (never two jobs
of a key at once, no attempt spent waiting), and so do three worker processes (their runs'
intervals on the server's clock never overlap per key); a rate of one a minute lets one job
of three start and puts the other two off (their records delayed), and a job refused by a
limit holds no lease, no slot and no fencing token."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import aqw
from tests._helpers import PG_DSNS, eventually

pytestmark = pytest.mark.timeout(90)
HERE = Path(__file__).resolve().parent

Interval = tuple[float, float]


@pytest.fixture
async def url() -> AsyncIterator[str]:
    """The URL of a queue in a fresh schema, dropped at the end."""
    dsn, schema = PG_DSNS[0], f"aqw_pgf_{uuid.uuid4().hex[:10]}"
    yield f"{dsn}?schema={schema}&queue=q"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def overlapping(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    ordered = sorted(intervals)
    return [(a, b) for a, b in itertools.pairwise(ordered) if b[0] < a[1]]


async def _state(app: aqw.App, job_id: str) -> str | None:
    info = await app.job(job_id)
    return None if info is None else info.state


async def test_a_cap_of_one_holds_across_two_apps(url: str) -> None:
    runs: dict[str, list[Interval]] = defaultdict(list)
    attempts: list[int] = []
    apps = [aqw.App(url), aqw.App(url)]
    tasks = []
    for app in apps:

        @app.task(name="capped", concurrency_key=lambda p: p["key"], max_per_key=1)
        async def capped(p: dict[str, Any], ctx: aqw.Context) -> None:
            start = time.monotonic()
            attempts.append(ctx.job.attempt)
            await asyncio.sleep(0.05)
            runs[p["key"]].append((start, time.monotonic()))

        tasks.append(capped)
    await tasks[0].enqueue_many([{"key": k, "n": n} for n in range(4) for k in "abc"])
    w1, w2 = apps[0].worker(concurrency=6), apps[1].worker(concurrency=6)
    async with w1, w2:
        await eventually(lambda: sum(map(len, runs.values())) == 12, 60, "every job")
    for key in "abc":
        assert len(runs[key]) == 4, key
        assert overlapping(runs[key]) == [], key
    assert set(attempts) == {1}  # waiting spent no attempt
    assert w1.stats.deferred + w2.stats.deferred > 0
    assert w1.stats.failed + w2.stats.failed == 0
    for app in apps:
        await app.close()


async def test_a_rate_of_one_a_minute_starts_one_job_of_three(url: str) -> None:
    app = aqw.App(url)
    ran: list[int] = []

    @app.task(name="slow_rate", rate_limit="1/m")
    async def slow_rate(n: int) -> None:
        ran.append(n)

    ids = [await slow_rate.enqueue(n) for n in range(3)]
    async with app.worker(concurrency=3) as worker:
        await eventually(lambda: len(ran) == 1, 30, "one job")

        async def put_off() -> bool:
            states = [await _state(app, i) for i in ids]
            return sorted(states, key=str) == ["delayed", "delayed", "succeeded"]

        await eventually(put_off, 30, "the other two put off")
        assert worker.stats.deferred >= 2
    assert len(ran) == 1
    for job_id in ids:
        info = await app.job(job_id)
        assert info is not None
        if info.state == "delayed":
            assert info.attempts == 0 and info.run_at is not None, info
    await app.close()


async def test_a_refused_start_takes_nothing(url: str) -> None:
    from aqw.flow import Limits, Rate

    app = aqw.App(url)
    b = app.broker
    await b.connect()
    rate = Rate(1, 60.0)
    bucket = Limits("t", rate.interval_us, rate.tolerance_us, (("k", 5),))
    one, two = aqw.Job(task="t", payload=1), aqw.Job(task="t", payload=2)
    await b.publish([one, two])
    fence = await b.job_lease_backend(one, bucket).acquire(b.job_lease_key(one), "a", 5000)
    assert fence is not None
    with pytest.raises(aqw.RateLimited):
        await b.job_lease_backend(two, bucket).acquire(b.job_lease_key(two), "b", 5000)
    schema = url.split("schema=")[1].split("&")[0]
    conn = await asyncpg.connect(PG_DSNS[0])
    try:
        leases = await conn.fetch(f'SELECT key FROM "{schema}".aqw_leases')
        slots = await conn.fetch(f'SELECT lease_key FROM "{schema}".aqw_slots')
        last = await conn.fetchval(f'SELECT last_value FROM "{schema}".aqw_fence')
    finally:
        await conn.close()
    assert [r["key"] for r in leases] == [b.job_lease_key(one)]
    assert [r["lease_key"] for r in slots] == [b.job_lease_key(one)]
    assert last == fence  # the refused start drew no fencing token
    assert await _state(app, two.id) == "queued"
    await app.close()


@pytest.mark.xdist_group("processes")
async def test_a_cap_of_one_holds_across_three_worker_processes(url: str) -> None:
    schema = url.split("schema=")[1].split("&")[0]
    ledger = f'"{schema}".ledger'
    app = aqw.App(url)

    @app.task(name="capped", concurrency_key=lambda p: p["key"], max_per_key=1)
    async def capped(p: dict[str, Any]) -> None: ...

    await app.broker.connect()
    conn = await asyncpg.connect(PG_DSNS[0])
    await conn.execute(
        f"CREATE TABLE {ledger} (id serial, key text, n int, attempt int, "
        "started timestamptz, ended timestamptz)"
    )
    await capped.enqueue_many([{"key": k, "n": n} for n in range(8) for k in "ab"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = str(HERE / "pg_capped_proc.py")
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, script, url, ledger, env=env)
        for _ in range(3)
    ]
    try:
        await eventually(
            lambda: conn.fetchval(f"SELECT count(*) = 16 FROM {ledger} WHERE ended IS NOT NULL"),
            60,
            "every job ran",
            procs=procs,
        )
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            await proc.wait()
    overlaps = await conn.fetchval(
        f"SELECT count(*) FROM {ledger} AS x JOIN {ledger} AS y "
        "ON x.key = y.key AND x.id < y.id AND x.started < y.ended AND y.started < x.ended"
    )
    runs = await conn.fetch(f"SELECT key, n, attempt FROM {ledger}")
    await conn.close()
    await app.close()
    assert overlaps == 0
    assert sorted((r["key"], r["n"]) for r in runs) == sorted(
        (k, n) for n in range(8) for k in "ab"
    )  # each job ran once
    assert {r["attempt"] for r in runs} == {1}  # waiting spent no attempt


async def test_concurrent_starts_under_a_rate_far_above_them_are_all_admitted(url: str) -> None:
    """Fifty starts at once under one bucket of a million a second: each is compared with
    the time once it holds the bucket's row, not the time it came in (then the starts that
    waited behind the others found their turns in the future and were refused)."""
    from aqw.flow import Limits, Rate

    apps = [aqw.App(url) for _ in range(2)]
    for app in apps:
        await app.broker.connect()
    rate = Rate(1_000_000, 1.0)
    bucket = Limits("fast", rate.interval_us, rate.tolerance_us)
    jobs = [aqw.Job(task="t", payload=n) for n in range(50)]
    await apps[0].broker.publish(jobs)

    async def start(i: int, job: aqw.Job) -> int | None:
        b = apps[i % 2].broker
        return await b.job_lease_backend(job, bucket).acquire(b.job_lease_key(job), "t", 5000)

    fences = await asyncio.gather(*(start(i, j) for i, j in enumerate(jobs)))
    assert all(f is not None for f in fences) and len(set(fences)) == 50
    for app in apps:
        await app.close()


async def test_crossing_caps_started_in_batches_from_two_apps_all_start(url: str) -> None:
    """Starts whose caps cross (pairs of six keys, each far from full) from two apps at once:
    each app's batch locks in its own order, so two batches may wait on each other (the
    server aborts one, whose starts then go one by one): every start is taken, none twice."""
    from aqw.flow import Limits

    apps = [aqw.App(url) for _ in range(2)]
    for app in apps:
        await app.broker.connect()
    pairs = list(itertools.combinations("abcdef", 2))
    jobs = [aqw.Job(task="t", payload=n) for n in range(90)]
    await apps[0].broker.publish(jobs)

    async def start(i: int, job: aqw.Job) -> int | None:
        b = apps[i % 2].broker
        x, y = pairs[(i * 7) % len(pairs)]
        limits = Limits(caps=((y, 1000), (x, 1000)))
        return await b.job_lease_backend(job, limits).acquire(b.job_lease_key(job), "t", 5000)

    fences = await asyncio.gather(*(start(i, j) for i, j in enumerate(jobs)))
    assert all(f is not None for f in fences) and len(set(fences)) == len(jobs)
    for app in apps:
        await app.close()
