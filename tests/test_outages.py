"""A broker that stops answering: one warning naming it (never its password), a reminder at a
slow interval, one "reconnected" line, and the queued jobs run once it is back; the
supervisor and ``aqw monitor`` give up quickly on a broker nobody ever reached.

The tests that stop Redis run their own redis-server (``private_redis``), never the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import eventually, free_port, running
from conftest import PrivateRedis
from redis.asyncio import Redis

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from aqw.worker._outage import Outage

pytestmark = pytest.mark.timeout(90)

TESTS = Path(__file__).resolve().parent


# -- the reporter, on a clock of its own ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_one_warning_a_slow_reminder_and_one_reconnected_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="aqw.worker")
    clock = Clock()
    outage = Outage("redis://db.internal:6380/2 queue=q", remind_every=30.0, clock=clock)
    outage.ok()  # nothing to say while the broker answers
    assert not caplog.records
    for _ in range(100):  # four loops failing every ~0.3 s for 29 s
        outage.failed("fetch", ConnectionError("Error 111 connecting to db.internal:6380"))
        clock.now += 0.29
    assert outage.outages == 1  # said once it had failed for a second
    (first,) = messages(caplog, logging.WARNING)
    assert "cannot reach the broker redis://db.internal:6380/2 queue=q" in first
    assert "fetch" in first and "Error 111" in first
    assert outage.down
    clock.now += 2.5  # 30 s after the warning: the reminder
    outage.failed("moving due jobs", TimeoutError())
    outage.failed("moving due jobs", TimeoutError())
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 2
    assert "still unreachable after 31s" in warnings[1]
    assert "101 failed calls" in warnings[1]
    clock.now += 5.02
    outage.ok()
    outage.ok()
    assert messages(caplog, logging.INFO) == [
        "reconnected to the broker redis://db.internal:6380/2 queue=q after 36.5s"
    ]
    assert not outage.down and outage.outages == 1
    assert len(messages(caplog, logging.DEBUG)) == 102  # every failure, at DEBUG


def test_a_failed_call_that_the_next_one_retries_is_not_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aqw.worker")
    clock = Clock()
    outage = Outage("memory://q", confirm_after=1.0, clock=clock)
    outage.failed("reclaiming abandoned jobs", OSError("Connection closed by server."))
    clock.now += 0.01
    outage.ok()  # a pooled connection the server had closed: the retry went through
    outage.failed("fetch", OSError("Connection closed by server."))
    clock.now += 0.9
    outage.failed("fetch", OSError("Connection refused"))
    outage.ok()
    assert not caplog.records and outage.outages == 0
    outage.failed("fetch", OSError("Connection refused"))
    clock.now += 1.0  # failing for a second: said
    outage.failed("promote", OSError("Connection refused"))
    (warning,) = messages(caplog, logging.WARNING)
    assert "for 1.0s (promote: OSError: Connection refused)" in warning
    assert outage.outages == 1


def test_brokers_describe_where_they_are_without_secrets() -> None:
    assert RedisBroker("redis://admin:hunter2@10.1.2.3:6380/4", "jobs").describe() == (
        "redis://10.1.2.3:6380/4 queue=jobs"
    )
    assert RedisBroker("redis://:hunter2@cache:6379", "jobs").describe() == (
        "redis://cache:6379/0 queue=jobs"
    )
    assert RedisBroker("rediss://u:hunter2@tls.example:6390/1", "q").describe() == (
        "rediss://tls.example:6390/1 queue=q"
    )
    assert RedisBroker("unix:///run/redis.sock?db=2", "q").describe() == (
        "unix:///run/redis.sock?db=2 queue=q"
    )
    assert MemoryBroker("m").describe() == "memory://m (in-process only)"
    sqs = aqw.App("sqs://orders?region=eu-west-1", queue="orders").broker
    assert sqs.describe() == "sqs queue orders (region=eu-west-1)"


# -- a real outage: a private redis-server stopped and started again -------------------------


async def restart_after(server: PrivateRedis, client: Redis, seconds: float) -> float:
    """Stop the server (saving its data), wait ``seconds``, start it again on its port.
    Returns how long it was down."""
    with contextlib.suppress(Exception):  # the server may hang up before it answers
        await client.shutdown(save=True)
    assert server.proc is not None
    server.proc.wait(timeout=10)
    server.proc = None
    down = time.monotonic()
    port = server.port
    await asyncio.sleep(seconds)
    server.start()
    assert server.port == port, "the server came back on another port"
    return time.monotonic() - down


async def test_a_redis_outage_is_one_warning_and_the_jobs_run_after_it(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aqw")
    app = aqw.App(private_redis.url, queue="outage", lease_ttl=2.0)
    done: list[int] = []

    @app.task(name="work")
    async def work(n: int) -> None:
        done.append(n)

    admin = Redis.from_url(private_redis.url)
    try:
        async with running(app.worker(concurrency=4, heartbeat=0.5)):
            for n in range(5):
                await work.enqueue(n)
            await eventually(lambda: len(done) == 5, 10, "the jobs before the outage")
            for n in range(5, 25):  # due while the broker is down
                await work.enqueue(n, delay=1.0)
            caplog.clear()
            down_for = await restart_after(private_redis, admin, 5.0)
            await eventually(lambda: len(done) == 25, 30, "the delayed jobs after the outage")
            await eventually(
                lambda: any("reconnected" in m for m in messages(caplog, logging.INFO)),
                10,
                "the reconnected line",
            )
            await asyncio.sleep(1.0)  # the other loops reconnect too: still one line
    finally:
        await admin.aclose()
        await app.close()
    assert sorted(done) == list(range(25)), "each job once"
    where = f"redis://127.0.0.1:{private_redis.port}/0 queue=outage"
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("aqw")
    ]
    assert 1 <= len(warnings) <= 2, warnings
    assert f"cannot reach the broker {where}" in warnings[0]
    reconnected = [m for m in messages(caplog, logging.INFO) if "reconnected" in m]
    assert len(reconnected) == 1, reconnected
    assert reconnected[0].startswith(f"reconnected to the broker {where} after ")
    said = float(reconnected[0].rpartition(" after ")[2].rstrip("s"))
    assert down_for - 1.0 < said < down_for + 5.0


# -- nobody ever reached the broker: give up fast -------------------------------------------


def run_aqw(*args: str, env: dict[str, str], timeout: float = 30) -> tuple[int, float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "aqw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=TESTS,
    )
    return done.returncode, time.monotonic() - started, done.stderr


def test_the_supervisor_gives_up_when_no_worker_ever_reached_the_broker(
    subprocess_env: dict[str, str],
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    code, _, stderr = run_aqw(
        "--log-level",
        "WARNING",
        "worker",
        "outage_app:app",
        "--processes",
        "2",
        "--broker",
        dead,
        env=subprocess_env,
    )
    assert code == 1, stderr
    # At once: no restart, no backoff ("restarting in" below); run_aqw's timeout bounds it.
    supervisor = [line for line in stderr.splitlines() if "aqw.supervisor" in line]
    assert len(supervisor) == 1, stderr
    assert "no worker could start (2 of 2 exited 1" in supervisor[0]
    assert "giving up" in supervisor[0]
    assert "restarting in" not in stderr
    # and each worker said why, once
    errors = [line for line in stderr.splitlines() if line.startswith("aqw: error:")]
    assert len(errors) == 2 and all("cannot reach" in line for line in errors), stderr


def test_aqw_monitor_gives_up_on_a_dead_broker(subprocess_env: dict[str, str]) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    give_up_after = 2.0
    code, took, stderr = run_aqw(
        "monitor", "--broker", dead, "--give-up-after", str(give_up_after), env=subprocess_env
    )
    assert code == 1, stderr
    assert took >= give_up_after, f"gave up after {took:.1f}s"  # it kept trying that long
    errors = [line for line in stderr.splitlines() if line.startswith("aqw: error:")]
    assert len(errors) == 1, stderr
    assert f"127.0.0.1:{dead.rsplit(':', 1)[1].split('/')[0]}" in errors[0]
    assert "2s" in errors[0]
