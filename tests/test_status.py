"""``aqw status``: the numbers a live worker on the real Redis produced, read back from another
client; worker sums that leave the monitor's heartbeat out; merged error fingerprints; one
job's record; ``--watch``.

The CLI wiring lives in ``aqw/cli/_status.py``; these tests call :func:`aqw.cli._status.run`
with the arguments ``aqw status`` parses, through :func:`aqw.cli._status.add_parser`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REDIS_URL

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from aqw.cli._status import add_parser, run
from aqw.monitor import CallbackSink, Monitor
from aqw.status import gather_status, render
from aqw.worker import Worker
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(60)


def status_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aqw")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["status", *argv])


async def status_json(capsys: pytest.CaptureFixture[str], queue: str) -> dict[str, Any]:
    assert await run(status_args("--broker", REDIS_URL, "--queue", queue, "--json")) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def build_app(broker: str | aqw.Broker, queue: str) -> aqw.App:
    app = aqw.App(broker, queue=queue, retry=aqw.RetryPolicy(max_retries=0, base=0.01, cap=0.01))

    @app.task(name="ok")
    async def ok(n: int) -> None:
        return None

    @app.task(name="flaky", max_retries=3)
    async def flaky(n: int, ctx: aqw.Context) -> None:
        if ctx.attempt == 1:
            raise aqw.Retry(delay=0.05, reason="not yet")

    @app.task(name="bad")
    async def bad(n: int) -> None:
        raise aqw.Reject("bad input")

    @app.task(name="boom")
    async def boom(n: int) -> None:
        raise ValueError(f"boom {n}")

    return app


async def enqueue_mix(app: aqw.App) -> None:
    """10 ok, 4 flaky (each retried once), 3 rejected, 2 failing without retries, 2 delayed."""
    await app.enqueue("ok", list(range(10)))
    await app.enqueue("flaky", list(range(4)))
    await app.enqueue("bad", list(range(3)))
    await app.enqueue("boom", list(range(2)))
    await app.enqueue("ok", [100, 101], delay=3600)


EXPECTED_5M = {"processed": 14, "retried": 4, "dead": 5, "failed": 9}


@pytest.mark.redis
async def test_status_json_reports_a_live_workers_numbers(
    queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    app = build_app(REDIS_URL, queue_name)
    try:
        await enqueue_mix(app)
        began = time.monotonic()
        async with Worker(app, heartbeat=0.2, concurrency=8) as worker:
            await eventually(
                lambda: worker.stats.processed == 14 and worker.stats.dead == 5,
                20,
                "the worker to settle the jobs",
            )

            async def settled() -> dict[str, Any] | None:
                s = await status_json(capsys, queue_name)
                return s if s["last_5m"]["processed"] == 14 and s["last_5m"]["dead"] == 5 else None

            status = await eventually(settled, 10, "a heartbeat with the final counts")
            assert {k: status["last_5m"][k] for k in EXPECTED_5M} == EXPECTED_5M
            assert {k: status["last_1m"][k] for k in EXPECTED_5M} == EXPECTED_5M
            assert status["last_5m"]["retry_rate"] == pytest.approx(4 / 14)
            assert status["depth"] == {"waiting": 0, "in_flight": 0, "delayed": 2, "dead": 5}
            assert [w["worker"] for w in status["workers"]] == [worker.name]
            assert (status["concurrency"], status["in_flight"], status["leases"]) == (8, 0, 0)
            assert status["counters"]["processed"] == 14
            assert status["counters"]["retried"] == 4 and status["counters"]["dead"] == 5
            # In seconds: no run lasted longer than the worker has been running.
            ran_for = time.monotonic() - began
            assert 0 < status["duration_5m"]["p50"] <= status["duration_5m"]["p99"] <= ran_for
            errors = {e["error_type"]: e for e in status["errors"]}
            assert (errors["Reject"]["count"], errors["Reject"]["task"]) == (3, "bad")
            assert errors["ValueError"]["count"] == 2
            assert "Retry" not in errors  # a requested retry is not an error
            assert status["alerts"] == [] and status["monitor"] is None and status["stuck"] == []

            assert await run(status_args("--broker", REDIS_URL, "--queue", queue_name)) == 0
            text = capsys.readouterr().out
            assert f"queue {queue_name}" in text and worker.name in text
            assert "retry rate" in text and "28.6%" in text
            assert "alerts: no monitor running" in text

        await app.enqueue("ok", [1, 2, 3])  # nobody consumes them now
        status = await status_json(capsys, queue_name)
        assert status["workers"] == [] and status["last_5m"]["processed"] == 0
        assert status["depth"]["waiting"] == 3 and status["depth"]["delayed"] == 2
    finally:
        await app.close()


APP_MODULE = """
import aqw

app = aqw.App(retry=aqw.RetryPolicy(max_retries=0, base=0.01, cap=0.01))

@app.task(name="ok")
async def ok(n: int) -> None:
    return None

@app.task(name="flaky", max_retries=3)
async def flaky(n: int, ctx: aqw.Context) -> None:
    if ctx.attempt == 1:
        raise aqw.Retry(delay=0.05, reason="not yet")

@app.task(name="bad")
async def bad(n: int) -> None:
    raise aqw.Reject("bad input")

@app.task(name="boom")
async def boom(n: int) -> None:
    raise ValueError(f"boom {n}")
"""


@pytest.mark.redis
async def test_status_reads_a_worker_process_heartbeat(
    queue_name: str,
    tmp_path: Path,
    subprocess_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "status_app.py").write_text(textwrap.dedent(APP_MODULE))
    producer = build_app(REDIS_URL, queue_name)
    try:
        await enqueue_mix(producer)
        proc = await asyncio.to_thread(
            subprocess.Popen,
            [
                sys.executable,
                "-m",
                "aqw",
                "worker",
                "status_app:app",
                "--broker",
                REDIS_URL,
                "--queue",
                queue_name,
                "--concurrency",
                "4",
            ],
            cwd=tmp_path,
            env=subprocess_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:

            async def settled() -> dict[str, Any] | None:
                s = await status_json(capsys, queue_name)
                return s if s["last_5m"]["processed"] == 14 and s["last_5m"]["dead"] == 5 else None

            # the default heartbeat is every 5 s: the second one carries the final counts
            status = await eventually(settled, 20, "the worker's heartbeat with the counts")
            assert {k: status["last_5m"][k] for k in EXPECTED_5M} == EXPECTED_5M
            assert [w["pid"] for w in status["workers"]] == [proc.pid]
            assert status["depth"] == {"waiting": 0, "in_flight": 0, "delayed": 2, "dead": 5}
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(proc.communicate, timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        assert proc.returncode == 0, err.decode()
        assert (await status_json(capsys, queue_name))["workers"] == []
    finally:
        await producer.close()


async def test_sums_leave_the_monitor_out_and_errors_merge_by_fingerprint(
    queue_name: str,
) -> None:
    broker = MemoryBroker(queue_name)
    now = time.time()

    def beat(
        name: str,
        processed: int,
        retried: int,
        p50: float,
        p99: float,
        errors: list[dict[str, Any]],
        **extra: Any,
    ) -> dict[str, Any]:
        return {
            "worker": name,
            "pid": 1,
            "state": "running",
            "at": now,
            "concurrency": 10,
            "in_flight": 2,
            "leases": 2,
            "last_1m": {"processed": processed // 2},
            "last_5m": {"processed": processed, "retried": retried, "failed": retried},
            "duration_5m": {"p50": p50, "p99": p99},
            "errors": errors,
            **extra,
        }

    def err(fp: str, count: int, last_seen: float, message: str) -> dict[str, Any]:
        return {
            "fingerprint": fp,
            "error_type": "KeyError",
            "message": message,
            "task": "t",
            "count": count,
            "last_seen": last_seen,
        }

    stuck = {
        "job_id": "j1",
        "task": "t",
        "sla": 1.0,
        "started_at": now - 5,
        "running_for": 5.0,
        "worker": "w1",
    }
    errors = [err("aa", 3, now - 9, "old"), err("bb", 1, now, "b")]
    w1 = beat("w1", 80, 10, 0.010, 0.200, errors, stuck=[stuck], runaway=["t"])
    await broker.status.publish_heartbeat("w1", w1, 60)
    w2 = beat("w2", 20, 0, 0.030, 0.050, [err("aa", 4, now - 1, "new")])
    await broker.status.publish_heartbeat("w2", w2, 60)
    monitor = Monitor(broker, sinks=[CallbackSink(lambda a: None)])
    await monitor.evaluate_once()  # 10% retries and j1 stuck: fires, publishes its heartbeat
    assert len(await broker.status.heartbeats()) == 3

    status = await gather_status(broker)
    assert [w["worker"] for w in status["workers"]] == ["w1", "w2"]
    assert status["last_5m"]["processed"] == 100 and status["last_5m"]["retried"] == 10
    assert status["last_5m"]["retry_rate"] == pytest.approx(0.1)
    assert status["last_1m"]["processed"] == 50 and status["last_1m"]["retry_rate"] == 0
    assert (status["concurrency"], status["in_flight"], status["leases"]) == (20, 4, 4)
    assert status["duration_5m"] == {"p50": 0.030, "p99": 0.200}  # the slowest worker's
    assert [(e["fingerprint"], e["count"], e["message"]) for e in status["errors"]] == [
        ("aa", 7, "new"),
        ("bb", 1, "b"),
    ]
    assert status["stuck"] == [stuck] and status["runaway"] == ["t"]
    assert [a["rule"] for a in status["alerts"]] == ["retry_rate", "stuck_job"]
    assert status["monitor"]["name"] == monitor.name

    text = render(status)
    assert "[warning] retry_rate" in text and "10.0%" in text
    assert "stuck jobs:" in text and "j1" in text
    assert "top errors (5m):" in text and "KeyError" in text
    assert "retries running away: t" in text
    assert "p50 30.0 ms" in text and "p99 200.0 ms" in text
    json.dumps(status)  # JSON-able for --json


async def test_status_of_an_empty_queue_renders(queue_name: str) -> None:
    status = await gather_status(aqw.App(MemoryBroker(queue_name)))
    assert status["workers"] == [] and status["last_5m"]["retry_rate"] is None
    text = render(status)
    assert "alerts: no monitor running" in text and "workers 0" in text


@pytest.mark.redis
async def test_status_job_id_shows_a_running_job_then_its_end(
    queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    app = aqw.App(RedisBroker(REDIS_URL, queue_name))
    release = asyncio.Event()
    halfway = asyncio.Event()

    @app.task(name="slow")
    async def slow(ctx: aqw.Context) -> None:
        await ctx.progress(0.5, "half way")
        halfway.set()
        await release.wait()

    target = ("--broker", REDIS_URL, "--queue", queue_name)
    try:
        [job_id] = await app.enqueue("slow", [None])
        async with Worker(app, heartbeat=0.2, concurrency=2, grace=1.0) as worker:
            await asyncio.wait_for(halfway.wait(), 10)
            assert await run(status_args(*target, job_id)) == 0
            text = capsys.readouterr().out
            assert text.startswith(f"job {job_id}: running\n")
            assert worker.name in text and "50% half way" in text
            assert await run(status_args(*target, job_id, "--json")) == 0
            shown = json.loads(capsys.readouterr().out)
            assert (shown["state"], shown["task"], shown["worker"]) == (
                "running",
                "slow",
                worker.name,
            )
            assert (shown["progress"], shown["message"]) == (0.5, "half way")
            release.set()
            await app.jobs.wait(job_id, timeout=10)
        assert await run(status_args(*target, job_id)) == 0
        assert capsys.readouterr().out.startswith(f"job {job_id}: succeeded\n")
        with pytest.raises(aqw.UnknownJob):  # the command line makes it exit status 6
            await run(status_args(*target, "no-such-job"))
    finally:
        await app.close()


async def test_watch_refreshes_until_ctrl_c(
    queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = status_args("--broker", f"memory://{queue_name}", "--watch", "0.05")
    task = asyncio.get_running_loop().create_task(run(args))
    out = ""

    async def refreshed_twice() -> bool:
        nonlocal out
        out += capsys.readouterr().out
        return out.count(f"aqw status: queue {queue_name}") >= 2

    await eventually(refreshed_twice, 10, "two refreshes")
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: handled by the watch loop
    assert await asyncio.wait_for(task, 5) == 130  # as a shell reports a Ctrl-C
    assert "\x1b" not in out  # not a terminal: no clear-screen codes
