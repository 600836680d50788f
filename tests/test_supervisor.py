"""``aqw.cli.supervisor.run_supervised``: N worker processes on the real Redis, restarted when
killed, stopped gracefully by SIGTERM, given up on in a crash loop.

The supervisor runs as ``python -c "...run_supervised(sys.argv[1:], N)"`` (the wiring of
``aqw worker --processes N`` calls the same function) and exits 0 after a graceful stop.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from conftest import REDIS_URL

import aqw

pytestmark = [pytest.mark.timeout(60), pytest.mark.redis]

APP_MODULE = """
import asyncio
import os

from redis.asyncio import Redis

import aqw

QUEUE = os.environ["AQW_QUEUE"]
app = aqw.App(os.environ["AQW_BROKER"], queue=QUEUE, lease_ttl=1.0)
_client = None


def client():
    global _client
    if _client is None:
        _client = Redis.from_url(os.environ["AQW_BROKER"])
    return _client


@app.task(name="work")
async def work(n: int, seconds: float = 0.01) -> None:
    await client().sadd(f"aqw:{{{QUEUE}}}:test:started", n)
    await asyncio.sleep(seconds)
    await client().sadd(f"aqw:{{{QUEUE}}}:test:done", n)
    await client().sadd(f"aqw:{{{QUEUE}}}:test:pids", os.getpid())
"""

SUPERVISE = (
    "import logging, sys\n"
    "logging.basicConfig(level='INFO', stream=sys.stderr, format='%(name)s: %(message)s')\n"
    "from aqw.cli.supervisor import run_supervised\n"
    "n, opts = int(sys.argv[1]), eval(sys.argv[2])\n"
    "sys.exit(run_supervised(sys.argv[3:], n, **opts))\n"
)

STARTED = re.compile(r"aqw\.supervisor: started worker (\d+) \(pid (\d+)\)")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_for(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Supervised:
    """The supervisor in a subprocess, its stderr collected line by line."""

    def __init__(
        self, cwd: Path, env: dict[str, str], processes: int, argv: list[str], **opts: object
    ) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUPERVISE, str(processes), repr(opts), *argv],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip())

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def started(self) -> list[tuple[int, int]]:
        """(slot, pid) of every worker started so far, in order."""
        return [(int(m[1]), int(m[2])) for line in self.lines if (m := STARTED.search(line))]

    def current_pids(self) -> dict[int, int]:
        return dict(self.started())

    def wait_started(self, count: int, timeout: float = 20) -> dict[int, int]:
        wait_for(lambda: len(self.started()) >= count, timeout, f"{count} starts\n{self.log}")
        return self.current_pids()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.current_pids().values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture
def supervise(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> Iterator[Callable[..., Supervised]]:
    (tmp_path / "sup_app.py").write_text(APP_MODULE)
    (tmp_path / "boom_app.py").write_text("raise RuntimeError('this module cannot be imported')\n")
    env = dict(subprocess_env, AQW_BROKER=REDIS_URL, AQW_QUEUE=queue_name)
    made: list[Supervised] = []

    def start(processes: int, *argv: str, **opts: object) -> Supervised:
        sup = Supervised(tmp_path, env, processes, list(argv), **opts)
        made.append(sup)
        return sup

    try:
        yield start
    finally:
        for sup in made:
            sup.stop()


@pytest.fixture
def producer(queue_name: str) -> Iterator[Callable[[list[dict[str, object]]], None]]:
    def enqueue(payloads: list[dict[str, object]]) -> None:
        import asyncio

        async def go() -> None:
            app = aqw.App(REDIS_URL, queue=queue_name)

            @app.task(name="work")
            async def work(n: int, seconds: float = 0.01) -> None: ...

            try:
                await work.enqueue_many(payloads)
            finally:
                await app.close()

        asyncio.run(go())

    yield enqueue


@pytest.fixture
def rclient() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    client.close()


def members(client: redis.Redis, queue: str, name: str) -> set[str]:
    return set(client.smembers(f"aqw:{{{queue}}}:test:{name}"))  # type: ignore[arg-type]


def pending(client: redis.Redis, queue: str) -> int:
    return int(client.xpending(f"aqw:{{{queue}}}:stream", "aqw")["pending"])  # type: ignore[index]


def assert_queue_settled(client: redis.Redis, queue: str) -> None:
    assert pending(client, queue) == 0


WORKER = ["--log-level", "INFO", "worker", "sup_app:app", "--concurrency", "8", "--grace", "5"]


def test_restarts_a_killed_worker_and_every_job_is_processed(
    supervise: Callable[..., Supervised],
    producer: Callable[[list[dict[str, object]]], None],
    rclient: redis.Redis,
    queue_name: str,
) -> None:
    sup = supervise(2, *WORKER, backoff=0.2)
    pids = sup.wait_started(2)
    assert sorted(pids) == [0, 1]
    producer([{"n": i, "seconds": 0.01} for i in range(400)])
    wait_for(lambda: len(members(rclient, queue_name, "done")) >= 20, 20, "the first jobs")

    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: sup.current_pids()[0] != victim, 10, f"a restart of worker 0\n{sup.log}")
    assert f"worker 0 (pid {victim}) was killed by SIGKILL; restarting" in sup.log
    replacement = sup.current_pids()[0]
    assert not alive(victim) and alive(replacement) and alive(pids[1])

    # The jobs the victim was running come back once their leases expire (lease_ttl 1s):
    # run again if it died before they finished, settled if it died between finish and ack.
    def settled() -> bool:
        done = len(members(rclient, queue_name, "done"))
        return done == 400 and rclient.xlen(f"aqw:{{{queue_name}}}:stream") == 0

    wait_for(settled, 30, f"all 400 jobs settled\n{sup.log}")
    # run by the supervised processes only (which of them took how many is the machine's
    # load: the other worker may have drained everything before the replacement started)
    ran_in = {int(p) for p in members(rclient, queue_name, "pids")}
    assert ran_in and ran_in <= {victim, replacement, pids[1]}, (ran_in, sup.log)

    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0, sup.log  # nothing left to wait for: a prompt, clean exit
    wait_for(lambda: "all workers stopped" in sup.log, 5, "the final log line")
    assert not any(alive(pid) for pid in sup.current_pids().values())
    assert_queue_settled(rclient, queue_name)


def test_sigterm_lets_running_jobs_finish(
    supervise: Callable[..., Supervised],
    producer: Callable[[list[dict[str, object]]], None],
    rclient: redis.Redis,
    queue_name: str,
) -> None:
    sup = supervise(2, "worker", "sup_app:app", "--concurrency", "2", "--grace", "10")
    sup.wait_started(2)
    producer([{"n": i, "seconds": 1.0} for i in range(10)])
    wait_for(lambda: len(members(rclient, queue_name, "started")) == 4, 15, "4 running jobs")
    started = members(rclient, queue_name, "started")
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(15) == 0, sup.log
    done = members(rclient, queue_name, "done")
    assert started <= done, "a running job did not finish within its grace"
    entries = rclient.xrange(f"aqw:{{{queue_name}}}:stream")
    assert len(done) + len(entries) == 10, "a job was lost"  # type: ignore[arg-type]
    assert_queue_settled(rclient, queue_name)
    assert not any(alive(pid) for pid in sup.current_pids().values())


def test_a_usage_error_stops_everything(supervise: Callable[..., Supervised]) -> None:
    sup = supervise(2, "worker", "no_such_module:app")
    assert sup.proc.wait(20) == 2, sup.log
    assert "usage or configuration error" in sup.log


def test_a_crash_loop_is_given_up(supervise: Callable[..., Supervised]) -> None:
    # started_after=0: count the worker as started at once, as one that crashes after it ran
    # (one that never starts is given up on at once: tests/test_outages.py)
    sup = supervise(1, "worker", "boom_app:app", backoff=0.01, max_restarts=3, started_after=0)
    assert sup.proc.wait(30) == 1, sup.log
    assert len(sup.started()) == 4  # the first start and three restarts
    assert "3 restarts within 60s: giving up" in sup.log


def test_workers_do_not_outlive_a_killed_supervisor(supervise: Callable[..., Supervised]) -> None:
    sup = supervise(2, *WORKER)
    pids = sup.wait_started(2)
    wait_for(
        lambda: "worker" in sup.log and sup.log.count(" started on ") >= 2,
        20,
        f"the workers to run\n{sup.log}",
    )
    sup.proc.kill()
    sup.proc.wait(10)
    wait_for(lambda: not any(alive(pid) for pid in pids.values()), 15, "the orphans to stop")


def test_worker_argv_drops_processes_and_keeps_the_rest() -> None:
    import argparse

    from aqw.cli.supervisor import worker_argv

    args = argparse.Namespace(
        log_level="DEBUG",
        command="worker",
        app="pkg.jobs:app",
        broker=None,
        queue="q",
        concurrency=64,
        prefetch=0,
        grace=12.5,
        priority_share=0.0,
        loop="uvloop",
        burst=True,
        processes=4,
    )
    assert worker_argv(args) == [
        "--log-level",
        "DEBUG",
        "worker",
        "pkg.jobs:app",
        "--queue",
        "q",
        "--concurrency",
        "64",
        "--prefetch",
        "0",
        "--grace",
        "12.5",
        "--priority-share",
        "0.0",
        "--loop",
        "uvloop",
        "--burst",
    ]
