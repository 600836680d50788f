"""A second Ctrl-C stops a worker at once: the first SIGINT starts a graceful stop (running
jobs get their grace), the second cancels the running jobs and hands them back to the queue,
not acknowledged; another worker then runs each to completion, once.

The workers are subprocesses (``handle_signals=True``, as ``aqw worker`` runs them) on the
shared Redis; nothing here stops or cuts Redis.
"""

from __future__ import annotations

import asyncio
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

pytestmark = [pytest.mark.timeout(90), pytest.mark.redis]

WORKER = """
import asyncio, logging, os, sys

from redis.asyncio import Redis

import aqw

URL, QUEUE, SECONDS = sys.argv[1], sys.argv[2], float(sys.argv[3])
app = aqw.App(URL, queue=QUEUE, lease_ttl=2.0)


@app.task(name="long")
async def long(n: int) -> None:
    r = Redis.from_url(URL)
    try:
        await r.rpush(f"aqw:{{{QUEUE}}}:test:started", f"{n} {os.getpid()}")
        await asyncio.sleep(SECONDS)
        await r.rpush(f"aqw:{{{QUEUE}}}:test:done", f"{n} {os.getpid()}")
    finally:
        await r.aclose()


async def main() -> None:
    worker = app.worker(concurrency=2, grace=30.0, handle_signals=True)
    try:
        await worker.run()
    finally:
        await app.close()
    print(f"stopped {worker.stats.as_dict()}", file=sys.stderr, flush=True)


logging.basicConfig(level="INFO", stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
asyncio.run(main())
"""


class Worker:
    """A worker subprocess whose stderr is collected line by line."""

    def __init__(self, script: Path, env: dict[str, str], queue: str, seconds: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script), REDIS_URL, queue, str(seconds)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def enqueue(queue: str, n: int) -> None:
    """Enqueue one ``long`` job, as a producer with the same task would."""
    app = aqw.App(REDIS_URL, queue=queue)

    @app.task(name="long")
    async def long(n: int) -> None: ...

    async def go() -> None:
        try:
            await long.enqueue(n)
        finally:
            await app.close()

    asyncio.run(go())


def wait_for(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def workers(
    tmp_path: Path, subprocess_env: dict[str, str], queue_name: str
) -> Iterator[Callable[[float], Worker]]:
    script = tmp_path / "forced_stop_worker.py"
    script.write_text(WORKER)
    made: list[Worker] = []

    def start(seconds: float) -> Worker:
        worker = Worker(script, subprocess_env, queue_name, seconds)
        made.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in made:
            worker.kill()


def test_a_second_sigint_stops_at_once_and_hands_the_job_back(
    workers: Callable[[float], Worker], queue_name: str
) -> None:
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    tag = f"aqw:{{{queue_name}}}"
    enqueue(queue_name, 1)
    try:
        first = workers(60.0)  # the job would run a minute
        wait_for(lambda: r.llen(f"{tag}:test:started") == 1, 20, f"the job to start\n{first.log}")

        first.proc.send_signal(signal.SIGINT)
        wait_for(lambda: first.said("stopping gracefully"), 10, f"the first SIGINT\n{first.log}")
        wait_for(lambda: first.said("waiting up to 30.0s for 1 running job"), 10, first.log)
        time.sleep(1.0)
        assert first.proc.poll() is None, f"the worker did not wait for its job\n{first.log}"

        first.proc.send_signal(signal.SIGINT)
        # Within 10 s: before the 30 s grace, let alone the job's minute, could have ended.
        assert first.finish(10) == 0, first.log
        assert first.said("again: stopping at once"), first.log
        assert first.said("1 running job cancelled and handed back to the queue"), first.log
        assert first.said("'requeued': 1"), first.log
        assert first.said("'processed': 0"), first.log
        assert r.llen(f"{tag}:test:done") == 0, "the job ran to its end in the first worker"

        second = workers(0.2)
        wait_for(lambda: r.llen(f"{tag}:test:done") == 1, 20, f"the job to run\n{second.log}")
        time.sleep(1.0)  # nothing more arrives
        second.proc.send_signal(signal.SIGINT)
        assert second.finish(15) == 0, second.log
        started = r.lrange(f"{tag}:test:started", 0, -1)
        done = r.lrange(f"{tag}:test:done", 0, -1)
        assert [s.split()[1] for s in started] == [str(first.proc.pid), str(second.proc.pid)]
        assert done == [f"1 {second.proc.pid}"], "the job completed once, by the second worker"
        assert second.said("'processed': 1"), second.log
        assert r.xlen(f"{tag}:stream") == 0
        assert r.xpending(f"{tag}:stream", "aqw")["pending"] == 0
    finally:
        r.close()


def test_one_sigint_lets_the_job_finish(
    workers: Callable[[float], Worker], queue_name: str
) -> None:
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    tag = f"aqw:{{{queue_name}}}"
    enqueue(queue_name, 2)
    try:
        worker = workers(2.0)
        wait_for(lambda: r.llen(f"{tag}:test:started") == 1, 20, f"the job to start\n{worker.log}")
        worker.proc.send_signal(signal.SIGINT)
        assert worker.finish(20) == 0, worker.log
        assert r.lrange(f"{tag}:test:done", 0, -1) == [f"2 {worker.proc.pid}"]
        assert worker.said("'processed': 1"), worker.log
        assert not worker.said("handed back"), worker.log
    finally:
        r.close()
