"""Periodic tasks (``aqw.Cron``, ``aqw.Every``): their options refused at registration, the
ticks they compute, and exactly one job per tick from one worker, from two, and from four
worker processes on the real Redis, one of them (the leader) SIGKILLed mid-run."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from _helpers import eventually
from _spawn import Forked, spawn_script
from _worker_script import ledger_key
from redis.asyncio import Redis

import aqw
from aqw.brokers.messages import ScheduleMark
from aqw.schedule import tick_iso, tick_key
from aqw.worker._scheduler import Scheduler

pytestmark = pytest.mark.timeout(60)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# -- refused at registration --------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        (aqw.Cron("not a cron"), "cron"),
        (aqw.Cron("61 * * * *"), "does not parse"),
        (aqw.Cron("* * * * *", tz="Mars/Olympus"), "tz"),
        (aqw.Every(0), "every"),
        (aqw.Every(-5), "every"),
        (aqw.Every(10, catch_up=-1), "catch_up"),
        (aqw.Every(10, skip_if_running=1), "skip_if_running"),  # type: ignore[arg-type]
        ("*/5 * * * *", "aqw.Cron"),
    ],
)
def test_bad_schedule_is_refused_naming_the_task_and_option(schedule: Any, words: str) -> None:
    app = aqw.App()
    with pytest.raises(aqw.ConfigError, match=words) as info:

        @app.task(name="periodic", schedule=schedule)
        async def periodic() -> None: ...

    assert "'periodic'" in str(info.value)
    assert "periodic" not in app.tasks


def test_a_periodic_handler_that_needs_a_payload_is_refused() -> None:
    app = aqw.App()
    with pytest.raises(aqw.ConfigError, match=r"'report'.*schedule.*user_id"):

        @app.task(name="report", schedule=aqw.Every(60))
        async def report(user_id: int) -> None: ...


def test_a_periodic_handler_with_defaults_only_is_accepted() -> None:
    app = aqw.App()

    @app.task(schedule=aqw.Every(60))
    async def one(ctx: aqw.Context, limit: int = 5) -> None: ...

    @app.task(schedule=aqw.Cron("0 * * * *"))
    async def two(a: int = 1, b: str = "x") -> None: ...

    assert one.codec.no_payload() == 5
    assert two.codec.no_payload() == {}
    assert one.validate(one.codec.no_payload()) == 5


# -- ticks --------------------------------------------------------------------------------


def test_every_is_aligned_to_the_epoch() -> None:
    every = aqw.Every(60)
    assert every.latest(125.5) == 120.0
    assert every.latest(120.0) == 120.0
    assert every.next_after(120.0) == 180.0
    assert aqw.Every(0.5).recent(None, 10.2, 3) == [9.0, 9.5, 10.0]


def test_catch_up_bounds_the_missed_ticks() -> None:
    assert aqw.Every(10).due(0.0, 100.0) == [100.0]  # default: only the latest due tick
    assert aqw.Every(10, catch_up=2).due(0.0, 105.0) == [80.0, 90.0, 100.0]
    assert aqw.Every(10, catch_up=50).due(60.0, 105.0) == [70.0, 80.0, 90.0, 100.0]
    assert aqw.Every(10, catch_up=2).due(100.0, 105.0) == []
    assert aqw.Every(10).due(None, 105.0) == []  # a new schedule starts at its next tick


def test_cron_ticks_in_its_time_zone() -> None:
    paris = aqw.Cron("0 9 * * *", tz="Europe/Paris")
    summer = _ts("2026-06-01T12:00:00+00:00")
    assert tick_iso(paris.latest(summer) or 0) == "2026-06-01T07:00:00.000+00:00"  # CEST
    winter = _ts("2026-01-15T12:00:00+00:00")
    assert tick_iso(paris.latest(winter) or 0) == "2026-01-15T08:00:00.000+00:00"  # CET
    utc = aqw.Cron("*/5 * * * *")
    at = _ts("2026-01-01T12:07:30+00:00")
    assert [tick_iso(t) for t in utc.due(at - 900, at)] == ["2026-01-01T12:05:00.000+00:00"]
    assert utc.recent(None, _ts("2026-01-01T12:05:00+00:00"), 1) == [
        _ts("2026-01-01T12:05:00+00:00")
    ]
    assert utc.next_after(at) == _ts("2026-01-01T12:10:00+00:00")
    caught = aqw.Cron("*/5 * * * *", catch_up=2).due(at - 3600, at)
    assert [tick_iso(t)[11:16] for t in caught] == ["11:55", "12:00", "12:05"]


def test_a_six_field_cron_has_seconds_first() -> None:
    cron = aqw.Cron("*/10 * * * * *")
    at = _ts("2026-01-01T12:00:35+00:00")
    assert cron.latest(at) == _ts("2026-01-01T12:00:30+00:00")
    assert cron.next_after(at) == _ts("2026-01-01T12:00:40+00:00")


def test_tick_key() -> None:
    assert tick_key("t", 0.5) == "cron:t:1970-01-01T00:00:00.500+00:00"


# -- the scheduler, in process ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "fakeredis"], indirect=True)
async def test_a_new_leader_catches_up_from_the_mark(backend: Any) -> None:
    app = backend.app()
    ran: list[str] = []

    @app.task(name="tick", schedule=aqw.Every(10, catch_up=2))
    async def tick() -> None:
        ran.append("x")

    worker = app.worker()
    scheduler = Scheduler(app.broker, app.tasks, asyncio.Event(), worker.outage, "w")
    await app.broker.connect()
    await scheduler.enqueue_due(now=1005.0)  # no mark: nothing, the mark is the latest tick
    assert (await app.broker.marks.read())["tick"].tick == 1000.0
    await scheduler.enqueue_due(now=1095.0)  # 9 ticks missed: the last 3
    mark = (await app.broker.marks.read())["tick"]
    assert mark.tick == 1090.0 and mark.job_id
    await scheduler.enqueue_due(now=1095.0)
    info = await app.job(mark.job_id)
    assert info is not None and info.key == tick_key("tick", 1090.0)
    await app.broker.marks.advance("tick", ScheduleMark(1070.0))  # moving back: refused
    assert (await app.broker.marks.read())["tick"].tick == 1090.0
    depth = await app.broker.depth()
    assert depth.waiting == 3


@pytest.mark.parametrize("backend", ["memory", "fakeredis"], indirect=True)
async def test_skip_if_running_skips_while_the_last_job_runs(backend: Any) -> None:
    app = backend.app()

    @app.task(name="slow", schedule=aqw.Every(10, skip_if_running=True))
    async def slow() -> None: ...

    worker = app.worker()
    scheduler = Scheduler(app.broker, app.tasks, asyncio.Event(), worker.outage, "w")
    await app.broker.connect()
    await scheduler.enqueue_due(now=1005.0)
    await scheduler.enqueue_due(now=1015.0)
    first = (await app.broker.marks.read())["slow"].job_id
    await scheduler.enqueue_due(now=1025.0)  # the job of 1010 is still queued: skipped
    mark = (await app.broker.marks.read())["slow"]
    assert (mark.tick, mark.job_id) == (1020.0, first)
    assert (await app.broker.depth()).waiting == 1


async def _run_workers(backend: Any, count: int, seconds: float) -> list[str]:
    keys: list[str] = []
    workers = []
    for _ in range(count):
        app = backend.app()

        @app.task(name="tick", schedule=aqw.Every(1))
        async def tick(ctx: aqw.Context) -> None:
            keys.append(ctx.job.key or "")

        workers.append(app.worker(concurrency=4))
    for worker in workers:
        await worker.start()
    try:
        await asyncio.sleep(seconds)
        leaders = [w for w in workers if w.scheduler.leader]
        assert len(leaders) == 1
    finally:
        for worker in workers:
            worker.scheduler.periodic.clear()  # no more ticks while the last jobs finish
        await asyncio.sleep(0.3)
        for worker in workers:
            await worker.stop()
    return keys


def _check_one_per_tick(keys: list[str], every: float, at_least: int) -> None:
    assert len(keys) == len(set(keys)), f"a tick enqueued twice: {sorted(keys)}"
    ticks = sorted(_ts(k.split(":", 2)[2]) for k in keys)
    assert len(ticks) >= at_least, ticks
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(ticks)}
    assert gaps == {every}, f"a tick missing: {ticks}"


@pytest.mark.parametrize("backend", ["memory", "fakeredis"], indirect=True)
async def test_one_worker_enqueues_one_job_per_tick(backend: Any) -> None:
    keys = await _run_workers(backend, 1, 3.5)
    _check_one_per_tick(keys, 1.0, 2)


@pytest.mark.parametrize("backend", ["memory", "fakeredis"], indirect=True)
async def test_two_workers_enqueue_one_job_per_tick(backend: Any) -> None:
    keys = await _run_workers(backend, 2, 3.5)
    _check_one_per_tick(keys, 1.0, 2)


async def test_cron_list_shows_the_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    from aqw.cli._cron import run

    app = aqw.App()

    @app.task(name="hourly", schedule=aqw.Cron("0 * * * *"))
    async def hourly() -> None: ...

    await app.broker.marks.advance("hourly", ScheduleMark(3600.0, "job-1"))
    import argparse
    import types

    module = types.ModuleType("cronapp")
    module.app = app  # type: ignore[attr-defined]
    sys.modules["cronapp"] = module
    try:
        args = argparse.Namespace(cron_command="list", app="cronapp:app", json=False)
        assert await run(args) == 0
    finally:
        del sys.modules["cronapp"]
    out = capsys.readouterr().out
    assert "hourly  cron 0 * * * * (UTC)" in out
    assert "1970-01-01 01:00:00 UTC" in out and "job-1" in out
    assert "next tick" in out


async def test_sqs_without_records_refuses_periodic_tasks() -> None:
    pytest.importorskip("aioboto3")
    app = aqw.App("sqs://sched-test?create=1")

    @app.task(schedule=aqw.Every(60))
    async def tick() -> None: ...

    with pytest.raises(aqw.ConfigError, match="records="):
        await app.worker().start()


# -- worker processes on the real Redis ----------------------------------------------------


async def _start(
    n: int, queue: str, repo_root: Path, env: dict[str, str], tmp: Path
) -> list[tuple[Forked, Path]]:
    out = []
    for i in range(n):
        path = tmp / f"scheduler-{i}.log"
        with path.open("wb") as log:
            proc = await spawn_script(
                repo_root / "tests" / "schedule_worker.py", queue, cwd=repo_root, env=env, log=log
            )
        out.append((proc, path))
    return out


async def _stop(procs: list[tuple[Forked, Path]]) -> None:
    for proc, _ in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for proc, _ in procs:
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()


async def _enqueued_keys(client: Redis, queue: str) -> list[str]:
    """The idempotency keys of every job record of ``queue`` (one record per enqueued job)."""
    keys = []
    async for name in client.scan_iter(match=f"aqw:{{{queue}}}:job:*", count=1000):
        key = await client.hget(name, "key")  # type: ignore[misc]
        if key:
            keys.append(key.decode())
    return keys


def _leaders(procs: list[tuple[Forked, Path]]) -> list[int]:
    return [i for i, (_, path) in enumerate(procs) if b" leads queue " in path.read_bytes()]


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
@pytest.mark.redis
async def test_four_processes_enqueue_each_tick_once(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    client = Redis.from_url(redis_url)
    procs = await _start(4, queue_name, repo_root, subprocess_env, tmp_path)
    try:
        await eventually(lambda: len(_leaders(procs)) == 1, 15, "a leader")
        await asyncio.sleep(5)  # five ticks, each raced for by four processes
    finally:
        await _stop(procs)
    try:
        keys = await _enqueued_keys(client, queue_name)
        _check_one_per_tick(keys, 1.0, 3)
        assert len(_leaders(procs)) == 1
    finally:
        await client.aclose()


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
@pytest.mark.redis
async def test_the_leader_sigkilled_another_takes_over_without_a_gap(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    client = Redis.from_url(redis_url)
    procs = await _start(3, queue_name, repo_root, subprocess_env, tmp_path)
    try:
        await eventually(lambda: len(_leaders(procs)) == 1, 15, "a leader")
        await asyncio.sleep(1.5)
        victim = _leaders(procs)[0]
        procs[victim][0].send_signal(signal.SIGKILL)
        await procs[victim][0].wait()
        # A new leader; "without a gap" is what the ticks below show: one job per tick.
        await eventually(lambda: len(_leaders(procs)) == 2, 15, "a new leader")
        await asyncio.sleep(2.5)  # ticks of the new leader after the gap
    finally:
        await _stop(procs)
    try:
        keys = await _enqueued_keys(client, queue_name)
        _check_one_per_tick(keys, 1.0, 5)  # catch_up=10 covers the takeover gap
    finally:
        await client.aclose()


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
@pytest.mark.redis
async def test_a_sigstopped_leader_thawed_later_enqueues_nothing_twice(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """The leader is frozen (SIGSTOP) past its lease: another leads; thawed, the old leader
    may still believe it leads for a moment, and every tick it enqueues then is one the
    per-tick idempotency key already holds: each tick is enqueued, and runs, exactly once."""
    client = Redis.from_url(redis_url)
    procs = await _start(3, queue_name, repo_root, subprocess_env, tmp_path)
    victim = -1
    try:
        await eventually(lambda: len(_leaders(procs)) == 1, 15, "a leader")
        await asyncio.sleep(1.5)
        victim = _leaders(procs)[0]
        procs[victim][0].send_signal(signal.SIGSTOP)
        await eventually(lambda: len(_leaders(procs)) == 2, 15, "a new leader")
        await asyncio.sleep(1.5)
        procs[victim][0].send_signal(signal.SIGCONT)
        await asyncio.sleep(3)  # the thawed leader's ticks, if it enqueues any, show up now
    finally:
        if victim >= 0:
            procs[victim][0].send_signal(signal.SIGCONT)
        await _stop(procs)
    try:
        keys = await _enqueued_keys(client, queue_name)
        _check_one_per_tick(keys, 1.0, 6)
        ran = [k.decode() for k in await client.lrange(ledger_key(queue_name), 0, -1)]  # type: ignore[misc]
        assert len(ran) == len(set(ran)), f"a tick ran twice: {sorted(ran)}"
        assert set(ran) <= set(keys)
    finally:
        await client.aclose()
