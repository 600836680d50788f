"""Crash recovery follows each job's own lease TTL, on the real Redis, with worker processes.

``App()`` keeps its default lease_ttl (30 s); task ``short`` has lease_ttl=2 s, task ``long``
lease_ttl=60 s (tests/recovery_worker.py). Worker X runs a ``short`` job and is SIGKILLed
mid-job; a new worker Z restarts that job within 5 s of the kill (not after the app's 30 s).
Meanwhile worker Y runs an 8 s ``long`` job whose pending entry sits idle far longer than the
shortest TTL the reclaimers scan for: it is never reclaimed, and runs exactly once.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest
from recovery_worker import SHORT_TTL, ledger_key, make_app, parse
from redis.asyncio import Redis

from aqw.brokers.redis import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

LONG_HOLD = 8.0
SHORT_HOLD = 3.0

Proc = asyncio.subprocess.Process


class Workers:
    """Worker processes of tests/recovery_worker.py, each with its log file."""

    def __init__(self, queue: str, root: Path, env: dict[str, str], logs: Path) -> None:
        self.queue, self.root, self.env, self.logs = queue, root, env, logs
        self.procs: list[Proc] = []
        self.names: dict[int, str] = {}
        self._files: list[IO[bytes]] = []

    async def start(self, concurrency: int) -> Proc:
        log = (self.logs / f"worker-{len(self.procs)}.log").open("wb")
        self._files.append(log)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(self.root / "tests" / "recovery_worker.py"),
            self.queue,
            str(concurrency),
            cwd=self.root,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        self.procs.append(proc)
        return proc

    async def ready(self, proc: Proc) -> None:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.startswith(b"ready "), line
        _, pid, name = line.decode().split()
        assert int(pid) == proc.pid
        self.names[proc.pid] = name

    async def stop(self, proc: Proc) -> dict[str, Any]:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, f"worker {proc.pid} exited with {proc.returncode}"
        line = next(ln for ln in out.decode().splitlines() if ln.startswith("stopped "))
        stats: dict[str, Any] = ast.literal_eval(line.removeprefix("stopped "))
        return stats

    async def aclose(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.wait_for(proc.wait(), 10)
        for log in self._files:
            log.close()
        for i in range(len(self._files)):
            text = (self.logs / f"worker-{i}.log").read_text(errors="replace")
            if "Traceback" in text:
                print(f"--- worker-{i}.log ---\n{text[-4000:]}")


async def test_a_killed_job_restarts_by_its_own_lease_ttl_and_a_live_long_job_is_left_alone(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    client = Redis.from_url(redis_url)
    producer = make_app(queue_name)
    assert producer.lease_ttl == 30.0  # the default, which recovery must not wait for
    broker = producer.broker
    assert isinstance(broker, RedisBroker)
    stream, key = broker.keys.stream, ledger_key(queue_name)
    workers = Workers(queue_name, repo_root, subprocess_env, tmp_path)

    async def ledger() -> list[tuple[str, str, int, int, int, float]]:
        return [parse(e) for e in await client.lrange(key, 0, -1)]

    async def wait_for_entry(within: float, what: str, **match: Any) -> tuple[Any, ...]:
        fields = ("task", "event", "fence", "attempt", "pid", "at")
        deadline = time.monotonic() + within
        while True:
            for entry in await ledger():
                named = dict(zip(fields, entry, strict=True))
                if all(v(named[k]) if callable(v) else named[k] == v for k, v in match.items()):
                    return entry
            for proc in workers.procs:
                if proc.returncode not in (None, -signal.SIGKILL):
                    raise AssertionError(f"worker {proc.pid} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within}s waiting for {what}")
            await asyncio.sleep(0.02)

    try:
        first, second = await workers.start(1), await workers.start(1)
        await asyncio.gather(workers.ready(first), workers.ready(second))
        await producer.tasks["long"].enqueue(LONG_HOLD)
        long_start = await wait_for_entry(10, "the long job to start", task="long", event="start")
        y = next(p for p in (first, second) if p.pid == long_start[4])
        x = second if y is first else first
        await producer.tasks["short"].enqueue(SHORT_HOLD)
        short_start = await wait_for_entry(10, "the short job to start", task="short")
        assert short_start[4] == x.pid, "the busy worker took the short job too"

        await asyncio.sleep(0.5)  # mid-job
        x.send_signal(signal.SIGKILL)
        await asyncio.wait_for(x.wait(), 10)
        killed_at = time.time()
        z = await workers.start(4)
        await workers.ready(z)
        restart = await wait_for_entry(
            15, "the short job to restart", task="short", event="start", pid=lambda p: p != x.pid
        )
        restarted_after = restart[5] - killed_at
        await wait_for_entry(15, "the short job to end", task="short", event="end")
        # the long job's entry, now: still pending, idle well past the shortest TTL the
        # reclaimers scan for, and still delivered only once, to Y
        pending: Any = await client.xpending_range(stream, "aqw", "-", "+", 10)
        of_y = [p for p in pending if p["consumer"].decode() == workers.names[y.pid]]
        assert len(of_y) == 1, pending
        assert of_y[0]["times_delivered"] == 1, of_y
        long_idle = of_y[0]["time_since_delivered"] / 1000
        long_end = await wait_for_entry(15, "the long job to end", task="long", event="end")
        z_stats = await workers.stop(z)
        y_stats = await workers.stop(y)

        entries = await ledger()
        print(f"restart {restarted_after:.2f}s after the kill; long entry idle {long_idle:.2f}s")
        # by its own 2 s lease, not by the app's default 30 s one: half of that is a bound no
        # loaded machine reaches, and no restart by the default could meet
        assert restarted_after < 30.0 / 2, (
            f"the short job restarted {restarted_after:.2f}s after the kill (lease_ttl "
            f"{SHORT_TTL}s; the app's default is 30s)"
        )
        assert long_idle > SHORT_TTL + 1.0, "the long job's entry was never old enough to steal"
        assert long_end[5] > restart[5], "the long job ended before the reclaim: nothing tested"

        longs = [e for e in entries if e[0] == "long"]
        assert [(e[1], e[4]) for e in longs] == [("start", y.pid), ("end", y.pid)], longs
        assert longs[0][2] == longs[1][2], "the long job changed holders"
        shorts = [e for e in entries if e[0] == "short"]
        assert [(e[1], e[4]) for e in shorts] == [
            ("start", x.pid),
            ("start", z.pid),
            ("end", z.pid),
        ], shorts
        assert shorts[1][2] > shorts[0][2], "the restart did not take a new fencing token"
        assert shorts[1][3] == 1, "a crash spent an attempt"

        assert y_stats["processed"] == 1 and y_stats["lease_lost"] == 0, y_stats
        assert z_stats["processed"] == 1, z_stats
        assert (await broker.stats()).get("processed") == 2
        assert await client.xlen(stream) == 0
        assert int((await client.xpending(stream, "aqw"))["pending"]) == 0
        assert await client.xlen(broker.keys.dlq) == 0
    finally:
        await workers.aclose()
        await producer.close()
        await client.aclose()
