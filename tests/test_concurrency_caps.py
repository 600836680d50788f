"""Per-key concurrency caps: ``@app.task(concurrency_key=fn, max_per_key=N)`` lets at most N
jobs of one key run at once across every worker (checked in the script that hands out the
job's lease); a waiting job holds no worker slot and spends no attempt; a crashed holder's
slot ages out with its lease; other keys are not held back. A debounced job waits for a
started one of its key (an implicit cap of 1). Three worker processes on the real Redis
share the caps.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend
from redis.asyncio import Redis

import aqw
from aqw._redis.keys import QueueKeys
from aqw.flow import DEBOUNCE_HEADER, debounce_cap
from tests._helpers import REDIS_URL, eventually, require_real_redis
from tests.test_rate_limits import SCRIPT, env_for_workers, ledger, start_workers, stop_workers

pytestmark = pytest.mark.timeout(60)

Interval = tuple[float, float]


def overlapping(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    """The pairs of ``intervals`` that overlap."""
    ordered = sorted(intervals)
    return [(a, b) for a, b in itertools.pairwise(ordered) if b[0] < a[1]]


def most_at_once(intervals: list[Interval]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


class Recorder:
    """Start and end (monotonic) of each run, by key."""

    def __init__(self) -> None:
        self.runs: dict[str, list[Interval]] = defaultdict(list)
        self.attempts: list[int] = []

    async def run(self, key: str, seconds: float, attempt: int = 1) -> None:
        start = time.monotonic()
        await asyncio.sleep(seconds)
        self.runs[key].append((start, time.monotonic()))
        self.attempts.append(attempt)

    def count(self) -> int:
        return sum(len(v) for v in self.runs.values())

    def everything(self) -> list[Interval]:
        return [i for v in self.runs.values() for i in v]


# -- the options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency_key": lambda p: p, "max_per_key": 0}, "max_per_key must be an integer"),
        ({"concurrency_key": lambda p: p, "max_per_key": -2}, "max_per_key must be an integer"),
        ({"concurrency_key": lambda p: p, "max_per_key": 1.5}, "max_per_key must be an integer"),
        ({"concurrency_key": lambda p: p, "max_per_key": True}, "max_per_key must be an integer"),
        ({"concurrency_key": lambda p: p}, "concurrency_key and max_per_key go together"),
        ({"max_per_key": 2}, "concurrency_key and max_per_key go together"),
        ({"concurrency_key": "k", "max_per_key": 2}, "concurrency_key must be a function"),
    ],
)
def test_bad_cap_options_are_refused_at_registration(options: dict[str, Any], message: str) -> None:
    app = aqw.App("memory://caps-bad")
    with pytest.raises(aqw.ConfigError, match=f"task 'job': {message}"):

        @app.task(name="job", **options)
        async def job(n: int) -> None: ...

    assert "job" not in app.tasks


def test_an_sqs_worker_refuses_a_capped_task() -> None:
    app = aqw.App("sqs://caps-q?region=us-east-1&endpoint_url=http://127.0.0.1:9")

    @app.task(name="capped", concurrency_key=lambda p: p, max_per_key=1)
    async def capped(n: int) -> None: ...

    with pytest.raises(aqw.ConfigError, match=r"task 'capped': max_per_key needs a broker"):
        app.worker()


def test_the_debounce_rule() -> None:
    plain = aqw.Job(task="t", payload=None, key="k")
    debounced = aqw.Job(task="t", payload=None, key="k", headers={DEBOUNCE_HEADER: "1"})
    assert debounce_cap(plain) is None
    assert debounce_cap(aqw.Job(task="t", payload=None, headers={DEBOUNCE_HEADER: "1"})) is None
    assert debounce_cap(debounced) == ("debounce:k", 1)


# -- one key at a time -------------------------------------------------------------------------


async def test_a_cap_of_one_runs_one_job_of_a_key_at_a_time(backend: Backend) -> None:
    app = backend.app()
    rec = Recorder()

    @app.task(name="capped", concurrency_key=lambda p: p["key"], max_per_key=1, max_retries=0)
    async def capped(p: dict[str, Any], ctx: aqw.Context) -> None:
        await rec.run(p["key"], 0.05, ctx.job.attempt)

    await capped.enqueue_many([{"key": k, "n": n} for n in range(4) for k in "abc"])
    w1, w2 = app.worker(concurrency=6), app.worker(concurrency=6)
    async with w1, w2:
        await eventually(lambda: rec.count() == 12, 30, "every job")
    for key, runs in rec.runs.items():
        assert len(runs) == 4, key
        assert overlapping(runs) == [], key
    assert most_at_once(rec.everything()) >= 2  # other keys were not held back
    assert set(rec.attempts) == {1}  # waiting spent no attempt
    assert w1.stats.deferred + w2.stats.deferred > 0
    assert w1.stats.failed + w2.stats.failed == 0


async def test_a_cap_of_two(backend: Backend) -> None:
    app = backend.app()
    rec = Recorder()

    @app.task(name="two", concurrency_key=lambda p: "same", max_per_key=2)
    async def two(n: int) -> None:
        await rec.run("same", 0.1)

    await two.enqueue_many(list(range(8)))
    async with app.worker(concurrency=8):
        await eventually(lambda: rec.count() == 8, 30, "every job")
    assert most_at_once(rec.runs["same"]) == 2


async def test_waiting_jobs_hold_no_worker_slot(backend: Backend) -> None:
    app = backend.app()
    rec = Recorder()

    @app.task(name="one_at_a_time", concurrency_key=lambda p: p["key"], max_per_key=1)
    async def one_at_a_time(p: dict[str, Any]) -> None:
        await rec.run(p["key"], 0.3 if p["key"] == "busy" else 0.0)

    await one_at_a_time.enqueue_many([{"key": "busy"} for _ in range(4)])
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: worker.stats.deferred >= 2, 10, "busy jobs put off")
        await one_at_a_time.enqueue({"key": "other"})
        await eventually(lambda: rec.runs["other"], 10, "the other key's job")
        assert len(rec.runs["busy"]) < 4  # it ran while busy jobs still waited
        await eventually(lambda: rec.count() == 5, 30, "every job")
    assert overlapping(rec.runs["busy"]) == []


async def test_a_waiting_job_reads_delayed(backend: Backend) -> None:
    app = backend.app()
    release = asyncio.Event()

    @app.task(name="holder", concurrency_key=lambda p: "k", max_per_key=1)
    async def holder(n: int) -> None:
        await release.wait()

    first = await holder.enqueue(1)
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: _state(app, first, "running"), 10, "the first job running")
        second = await holder.enqueue(2)
        await eventually(lambda: _state(app, second, "delayed"), 10, "the second put off")
        info = await app.job(second)
        assert info is not None and info.attempts == 0 and info.run_at is not None, info
        assert worker.stats.deferred >= 1
        release.set()
        await eventually(lambda: _state(app, second, "succeeded"), 10, "the second job")
    info = await app.job(second)
    assert info is not None and info.attempts == 1


async def _state(app: aqw.App, job_id: str, state: str) -> bool:
    info = await app.job(job_id)
    return info is not None and info.state == state


async def test_a_long_job_keeps_its_slot_through_renewals(backend: Backend) -> None:
    app = backend.app()
    rec = Recorder()

    @app.task(name="long", concurrency_key=lambda p: "k", max_per_key=1, lease_ttl=0.6)
    async def long(n: int) -> None:
        await rec.run("k", 1.5 if n == 0 else 0.0)

    await long.enqueue(0)
    async with app.worker(concurrency=4):
        await eventually(lambda: len(rec.runs) == 0 and _started(app), 10, "the long job")
        await long.enqueue_many([1, 2])
        await eventually(lambda: rec.count() == 3, 30, "every job")
    assert overlapping(rec.runs["k"]) == []


async def _started(app: aqw.App) -> bool:
    return bool(await app.broker.records.running_states())


async def test_a_crashed_holders_slot_ages_out_with_its_lease(redis_backend: Backend) -> None:
    app = redis_backend.app()
    raw = redis_backend.raw
    assert raw is not None
    prefix = f"aqw:{{{redis_backend.queue}}}:"
    ghost = prefix + "lease:ghost"  # a holder that died: its lease expires, nobody settles it
    await raw.set(ghost, "token", px=800)
    await raw.zadd(prefix + "slots:task:after_crash:k", {ghost: 1})
    started: list[float] = []

    @app.task(name="after_crash", concurrency_key=lambda p: "k", max_per_key=1)
    async def after_crash(n: int) -> None:
        started.append(time.monotonic())

    enqueued = time.monotonic()
    await after_crash.enqueue(1)
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: started, 10, "the job, once the dead holder's lease expired")
    assert started[0] - enqueued >= 0.5  # it waited for the lease to expire
    assert worker.stats.deferred >= 1
    members = await raw.zrange(prefix + "slots:task:after_crash:k", 0, -1)  # type: ignore[misc]
    assert ghost.encode() not in members  # dropped once its lease was gone


async def test_slots_are_named_in_the_queue_and_vanish(redis_backend: Backend) -> None:
    app = redis_backend.app()
    raw = redis_backend.raw
    assert raw is not None
    key = QueueKeys(redis_backend.queue).slots("task:brief:c7")
    done: list[tuple[int, bytes, int]] = []

    @app.task(name="brief", concurrency_key=lambda p: f"c{p}", max_per_key=3, lease_ttl=0.5)
    async def brief(n: int) -> None:  # the slot, looked at while the job holds it
        members = await raw.zrange(key, 0, -1)  # type: ignore[misc]
        done.append((n, b"".join(members), await raw.pttl(key)))

    await brief.enqueue(7)
    async with app.worker(concurrency=1):
        await eventually(lambda: done, 10, "the job")
    [(n, members, pttl)] = done
    assert n == 7 and members  # named in the queue's keys while it runs
    # It lives no longer than the lease it counts: a reading of the TTL is never above the
    # lease's (and the key may already be gone, if the machine was slow to read it).
    assert pttl == -2 or 0 < pttl <= int(0.5 * 1000), pttl
    await eventually(lambda: _gone(raw, key), 10, "the idle slot set expired")


async def _gone(raw: Redis, key: str) -> bool:
    return not await raw.exists(key)


# -- debounced jobs: an implicit cap of one per key ------------------------------------------


async def test_a_debounced_job_waits_for_a_started_one_of_its_key(backend: Backend) -> None:
    app = backend.app()
    rec = Recorder()

    @app.task(name="debounced")
    async def debounced(n: int) -> None:
        await rec.run("k", 0.2)

    jobs = [
        aqw.Job(task="debounced", payload=n, key="k", headers={DEBOUNCE_HEADER: "1"})
        for n in range(3)
    ]
    await app.broker.publish(jobs)
    async with app.worker(concurrency=4) as worker:
        await eventually(lambda: rec.count() == 3, 30, "every job")
    assert overlapping(rec.runs["k"]) == []
    assert worker.stats.deferred >= 1


# -- three worker processes on the real Redis --------------------------------------------------


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
@pytest.mark.slow
async def test_three_processes_share_one_cap_per_key(queue_name: str, tmp_path: Path) -> None:
    require_real_redis()
    client = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue_name)

    @app.task(name="capped", concurrency_key=lambda p: p["key"], max_per_key=1)
    async def capped(p: dict[str, Any]) -> None: ...

    env = env_for_workers(SCRIPT.parent.parent)
    procs = await start_workers(3, queue_name, "cap", env, tmp_path)
    try:
        await capped.enqueue_many([{"key": k, "n": n} for n in range(6) for k in "abcd"])
        await eventually(
            lambda: _ledger_len(client, queue_name, 24), 40, "24 runs", interval=0.2, procs=procs
        )
        await asyncio.sleep(0.3)  # any duplicate run would show up now
        entries = await ledger(client, queue_name)
    finally:
        await stop_workers(procs)
        await app.close()
        await client.aclose()
    assert sorted((e["key"], e["n"]) for e in entries) == sorted(
        (k, n) for n in range(6) for k in "abcd"
    )
    by_key: dict[str, list[Interval]] = defaultdict(list)
    for e in entries:
        by_key[e["key"]].append((e["start"], e["end"]))
    for key, runs in by_key.items():
        assert overlapping(runs) == [], (key, sorted(runs))
    everything = [i for runs in by_key.values() for i in runs]
    assert most_at_once(everything) >= 2  # other keys were not held back
    assert len({e["pid"] for e in entries}) >= 2  # the processes shared the work


async def _ledger_len(client: Redis, queue: str, n: int) -> bool:
    return bool(await client.llen(f"aqw:{{{queue}}}:ledger") >= n)  # type: ignore[misc]
