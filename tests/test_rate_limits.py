"""Rate limits: ``@app.task(rate_limit="20/s", rate_key=...)`` spaces the starts of a task's
jobs across every worker (checked in the script that hands out the job's lease); a job over
the limit waits in the delayed set without spending an attempt; a handler's
``aqw.RateLimited`` (an upstream 429) does the same. Three worker processes on the real Redis
hold one limit together.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.asyncio import Redis

import aqw
from aqw._redis.keys import QueueKeys
from aqw.flow import FlowControl, Rate, flow_control, parse_rate
from aqw.telemetry._instruments import INSTRUMENTS
from tests._helpers import REDIS_URL, eventually, moto_server, require_real_redis
from tests._spawn import spawn_script

pytestmark = pytest.mark.timeout(60)


def most_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` inside any window of ``window`` seconds."""
    times = sorted(times)
    most, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


async def start_times(app: aqw.App, ids: list[str]) -> list[float]:
    """The server-clock start times of the jobs' last runs (their records)."""
    out = []
    for job_id in ids:
        info = await app.job(job_id)
        assert info is not None and info.started_at is not None, (job_id, info)
        out.append(info.started_at.timestamp())
    return out


# -- the options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/s", Rate(100, 1.0)),
        ("100/sec", Rate(100, 1.0)),
        ("5/m", Rate(5, 60.0)),
        ("5/min", Rate(5, 60.0)),
        ("2/h", Rate(2, 3600.0)),
        (" 7 / hour ", Rate(7, 3600.0)),
    ],
)
def test_rate_limit_texts(text: str, rate: Rate) -> None:
    assert parse_rate(text, "t") == rate


@pytest.mark.parametrize("bad", ["fast", "0/s", "-1/s", "10/d", "1.5/s", "/s", "10", 10, ""])
def test_a_bad_rate_limit_is_refused_at_registration_naming_it(bad: Any) -> None:
    app = aqw.App("memory://rl-bad")
    with pytest.raises(aqw.ConfigError, match=r"task 'job': rate_limit must be"):

        @app.task(name="job", rate_limit=bad)
        async def job() -> None: ...

    assert "job" not in app.tasks


def test_rate_key_needs_a_rate_limit_and_must_be_callable() -> None:
    app = aqw.App("memory://rl-key")
    with pytest.raises(aqw.ConfigError, match="rate_key needs a rate_limit"):

        @app.task(name="a", rate_key=lambda p: p)
        async def a(n: int) -> None: ...

    with pytest.raises(aqw.ConfigError, match="rate_key must be a function"):

        @app.task(name="b", rate_limit="1/s", rate_key="customer")  # type: ignore[arg-type]
        async def b(n: int) -> None: ...


def test_the_burst_is_one_percent_of_the_count() -> None:
    assert (Rate(20, 1.0).burst, Rate(20, 1.0).tolerance_us) == (1, 0)  # strictly spaced
    assert (Rate(199, 60.0).burst, Rate(200, 1.0).burst) == (1, 2)
    assert Rate(10_000, 1.0).interval_us == 100
    assert Rate(10_000, 1.0).tolerance_us == 99 * 100


def test_no_limit_is_no_flow_control() -> None:
    flow = flow_control("t")
    assert flow == FlowControl() and flow.options == ()
    assert flow_control("t", "3/s").options == ("rate_limit",)


# -- one limit across workers ------------------------------------------------------------------


async def test_starts_are_spaced_by_the_rate_limit_across_two_workers(backend: Backend) -> None:
    app = backend.app()
    runs: Counter[int] = Counter()
    attempts: set[int] = set()

    @app.task(name="limited", rate_limit="20/s", max_retries=0)
    async def limited(n: int, ctx: aqw.Context) -> None:
        runs[n] += 1
        attempts.add(ctx.job.attempt)

    ids = await limited.enqueue_many(list(range(30)))
    w1, w2 = app.worker(concurrency=10), app.worker(concurrency=10)
    async with w1, w2:
        await eventually(lambda: len(runs) == 30, 30, "every job")
    assert runs == Counter(range(30))  # each exactly once
    assert attempts == {1}  # waiting spent no attempt
    starts = await start_times(app, ids)
    assert most_in_window(starts, 1.0) <= 21, sorted(starts)
    assert max(starts) - min(starts) >= 29 * 0.05 * 0.99  # 30 starts, 50 ms apart
    assert w1.stats.deferred + w2.stats.deferred > 0
    for job_id in ids:
        info = await app.job(job_id)
        assert info is not None and info.attempts == 1, info


async def test_a_job_over_the_limit_reads_delayed_with_its_turn(backend: Backend) -> None:
    app = backend.app()
    ran: list[int] = []

    @app.task(name="slow", rate_limit="1/min")
    async def slow(n: int) -> None:
        ran.append(n)

    first = await slow.enqueue(1)
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: ran == [1], 10, "the first job")
        second = await slow.enqueue(2)
        before = time.time()
        await eventually(lambda: worker.stats.deferred >= 1, 10, "the second job put off")
        info = await app.job(second)
        assert info is not None and info.state == "delayed", info
        assert info.attempts == 0
        assert info.run_at is not None
        assert before + 50 < info.run_at.timestamp() < time.time() + 61
        assert ran == [1]
        assert (await app.broker.depth()).delayed == 1
    assert (await app.job(first)).state == "succeeded"  # type: ignore[union-attr]


async def test_a_put_off_job_waits_in_its_own_levels_delayed_set(redis_backend: Backend) -> None:
    app = redis_backend.app()
    ran: list[int] = []

    @app.task(name="urgent", rate_limit="1/min", priority=5)
    async def urgent(n: int) -> None:
        ran.append(n)

    await urgent.enqueue_many([1, 2])
    raw = redis_backend.raw
    assert raw is not None
    prefix = f"aqw:{{{redis_backend.queue}}}:"
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: worker.stats.deferred >= 1, 10, "the second job put off")
        assert await raw.zcard(prefix + "delayed:p5") == 1
        assert await raw.zcard(prefix + "delayed") == 0
    assert len(ran) == 1


async def test_one_bucket_per_rate_key(backend: Backend) -> None:
    app = backend.app()
    ran: list[tuple[str, int]] = []

    @app.task(name="per_customer", rate_limit="1/min", rate_key=lambda p: p["customer"])
    async def per_customer(p: dict[str, Any]) -> None:
        ran.append((p["customer"], p["n"]))

    await per_customer.enqueue_many(
        [{"customer": c, "n": n} for n in (1, 2) for c in ("a", "b", "c")]
    )
    async with app.worker(concurrency=6) as worker:
        await eventually(lambda: len(ran) == 3, 10, "one job of each customer")
        await eventually(lambda: worker.stats.deferred >= 3, 10, "the others put off")
        await asyncio.sleep(0.2)
        assert sorted(c for c, _ in ran) == ["a", "b", "c"]


async def test_an_idle_bucket_expires(redis_backend: Backend) -> None:
    app = redis_backend.app()
    done: list[int] = []

    @app.task(name="brief", rate_limit="10/s")
    async def brief(n: int) -> None:
        done.append(n)

    await brief.enqueue(1)
    async with app.worker(concurrency=1):
        await eventually(lambda: done == [1], 10, "the job")
    assert redis_backend.raw is not None
    key = QueueKeys(redis_backend.queue).rate("brief")
    ttl = await redis_backend.raw.pttl(key)
    assert -2 <= ttl <= 100 and ttl != -1  # gone, or going within one interval


# -- RateLimited from a handler ----------------------------------------------------------------


def new_meter_provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    keep = []
    while True:
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        keep.append(provider)
        if id(provider) not in INSTRUMENTS:
            return provider, reader


def deferred_points(reader: InMemoryMetricReader) -> list[tuple[dict[str, Any], int]]:
    data = reader.get_metrics_data()
    out = []
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "aqw.jobs.deferred":
                    out += [(dict(p.attributes), p.value) for p in metric.data.data_points]
    return out


async def test_a_handlers_rate_limited_puts_the_job_off_without_spending_an_attempt(
    backend: Backend,
) -> None:
    mp, reader = new_meter_provider()
    app = backend.app(meter_provider=mp)
    calls: list[tuple[int, float]] = []

    @app.task(name="upstream", max_retries=0)  # no retry budget at all: a deferral needs none
    async def upstream(ctx: aqw.Context) -> str:
        calls.append((ctx.job.attempt, time.monotonic()))
        if len(calls) < 3:
            raise aqw.RateLimited(0.2)
        return "ok"

    job_id = await upstream.enqueue()
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: len(calls) == 3, 15, "three calls")
        info = await app.result(job_id, timeout=10)
    assert info is None  # no kept result: the job ended
    assert [a for a, _ in calls] == [1, 1, 1]
    assert all(b - a >= 0.15 for (_, a), (_, b) in itertools.pairwise(calls))
    record = await app.job(job_id)
    assert record is not None and record.state == "succeeded" and record.attempts == 1
    assert worker.stats.deferred == 2 and worker.stats.failed == 0 and worker.stats.retried == 0
    points = deferred_points(reader)
    assert [(p["reason"], p["aqw.task"], n) for p, n in points] == [("handler", "upstream", 2)]
    mp.shutdown()


def test_rate_limited_checks_its_delay() -> None:
    assert aqw.RateLimited(1).retry_after == 1.0
    assert aqw.RateLimited(0.5).reason == "handler"
    for bad in (-1, float("nan"), float("inf"), "1", True):
        with pytest.raises(aqw.ConfigError, match="retry_after"):
            aqw.RateLimited(bad)  # type: ignore[arg-type]


async def test_rate_limit_deferrals_are_counted_with_their_reason(backend: Backend) -> None:
    mp, reader = new_meter_provider()
    app = backend.app(meter_provider=mp)
    ran: list[int] = []

    @app.task(name="metered", rate_limit="1/min")
    async def metered(n: int) -> None:
        ran.append(n)

    await metered.enqueue_many([1, 2])
    async with app.worker(concurrency=2) as worker:
        await eventually(lambda: worker.stats.deferred >= 1, 10, "a deferral")
    points = deferred_points(reader)
    assert {(p["reason"], p["aqw.task"]) for p, _ in points} == {("rate_limit", "metered")}
    assert sum(n for _, n in points) == worker.stats.deferred
    mp.shutdown()


# -- SQS: no shared store for limits -----------------------------------------------------------


def test_an_sqs_worker_refuses_a_rate_limited_task() -> None:
    app = aqw.App("sqs://rl-q?region=us-east-1&endpoint_url=http://127.0.0.1:9")

    @app.task(name="capped", rate_limit="5/s")
    async def capped() -> None: ...

    with pytest.raises(aqw.ConfigError, match=r"task 'capped': rate_limit needs a broker"):
        app.worker()


async def test_a_handlers_rate_limited_on_sqs_hides_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with moto_server() as endpoint:
        url = f"sqs://rl-429?region=us-east-1&endpoint_url={endpoint}&create=1&dlq=none&wait=1"
        app = aqw.App(url)
        calls: list[int] = []

        @app.task(name="upstream")
        async def upstream(ctx: aqw.Context) -> None:
            calls.append(ctx.job.attempt)
            if len(calls) == 1:
                raise aqw.RateLimited(1)

        try:
            job_id = await upstream.enqueue()
            async with app.worker(concurrency=2) as worker:
                await eventually(lambda: worker.stats.processed == 1, 30, "the second run")
            assert calls == [1, 2]  # SQS counts the receive (docs/concepts/flow-control.md)
            assert worker.stats.deferred == 1 and worker.stats.failed == 0
            counts = await app.broker.stats()
            assert counts.get("deferred") == 1 and "retried" not in counts, counts
            info = await app.job(job_id)
            assert info is not None and info.state == "succeeded"
        finally:
            await app.close()


# -- three worker processes on the real Redis --------------------------------------------------

SCRIPT = Path(__file__).resolve().parent / "limits_worker.py"


async def start_workers(n: int, queue: str, mode: str, env: dict[str, str], tmp: Path) -> list[Any]:
    procs = []
    for i in range(n):
        with (tmp / f"worker-{i}.log").open("wb") as log:
            procs.append(await spawn_script(SCRIPT, queue, mode, env=env, log=log))
    return procs


async def stop_workers(procs: list[Any]) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()


async def ledger(client: Redis, queue: str) -> list[dict[str, Any]]:
    raw = await client.lrange(f"aqw:{{{queue}}}:ledger", 0, -1)  # type: ignore[misc]
    return [json.loads(x) for x in raw]


def env_for_workers(repo_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
@pytest.mark.slow
async def test_four_processes_hold_one_rate_limit(queue_name: str, tmp_path: Path) -> None:
    """4 worker processes, ``rate_limit="50/s"``, 250 jobs (five seconds' worth): no 1-second
    window of the server's clock holds more than 50 starts, every job runs once, and no
    deferral spends an attempt."""
    jobs = 250
    require_real_redis()
    client = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue_name)

    @app.task(name="limited", rate_limit="50/s")
    async def limited(n: int) -> None: ...

    procs = await start_workers(
        4, queue_name, "rate", env_for_workers(SCRIPT.parent.parent), tmp_path
    )
    try:
        await limited.enqueue_many(list(range(jobs)))
        await eventually(
            lambda: _count(client, queue_name, jobs), 60, "every run", interval=0.2, procs=procs
        )
        await asyncio.sleep(0.5)  # any duplicate run would show up now
        entries = await ledger(client, queue_name)
        starts = await start_times(app, [e["id"] for e in entries])  # the server's clock
    finally:
        await stop_workers(procs)
        await app.close()
        await client.aclose()
    assert sorted(e["n"] for e in entries) == list(range(jobs))  # each exactly once
    assert {e["attempt"] for e in entries} == {1}
    assert len({e["pid"] for e in entries}) >= 3  # the processes shared the work
    assert most_in_window(starts, 1.0) <= 50, sorted(starts)


async def _count(client: Redis, queue: str, n: int) -> bool:
    return bool(await client.llen(f"aqw:{{{queue}}}:ledger") >= n)  # type: ignore[misc]
