"""The worker side of ``aqw bench``: the jobs it runs (synthetic, or a task of your app), and
the workers that run them, noting when jobs settled (from the workers' own counters): one in
this process (``memory://``) or child processes that report as JSON lines on stdout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from ...app import App
from ...context import Context
from ...errors import ConfigError
from ...task import Task
from ...worker import Worker
from .._common import load_app

CHILD_CODE = "from aqw.cli.bench._worker import child_main; child_main()"

#: Seconds between two readings of a worker's counters.
SAMPLE = 0.001


class _Work(BaseModel):
    kind: Literal["noop", "sleep", "cpu"] = "noop"
    ms: float = 0.0


async def _synthetic(work: _Work) -> None:
    if work.kind == "sleep":
        await asyncio.sleep(work.ms / 1000)
    elif work.kind == "cpu":
        end = time.perf_counter() + work.ms / 1000
        while time.perf_counter() < end:
            pass


Payloads = Callable[[int, int], list[Any]]


@dataclass
class Target:
    """The app (on the bench queue), the task and a payload maker ``(first, count)``."""

    app: App
    task: Task[Any]
    payloads: Payloads
    #: The ``enqueued_at`` of each synthetic job run in this process, in the order their
    #: handlers finished; None for a task of your app (its handler is not the bench's).
    finished: list[float] | None = None


def target(cfg: dict[str, Any]) -> Target:
    """The app, task and payloads of the bench's jobs."""
    if cfg["app"]:
        app = load_app(cfg["app"])
        app.use_broker(cfg["broker"], cfg["queue"])
        sample = cfg["payload"]
        return Target(app, app.get_task(cfg["task"]), lambda first, count: [sample] * count)
    app = App(cfg["broker"], queue=cfg["queue"])
    finished: list[float] = []

    async def aqw_bench(work: _Work, ctx: Context) -> None:
        await _synthetic(work)
        finished.append(ctx.job.enqueued_at)

    task = app.task(name="aqw_bench")(aqw_bench)
    kinds = ["noop", "sleep", "cpu"] if cfg["work"] == "mix" else [cfg["work"]]
    ms = {"noop": 0.0, "sleep": cfg["sleep_ms"], "cpu": cfg["cpu_ms"]}

    def payloads(first: int, count: int) -> list[Any]:
        picked = (kinds[i % len(kinds)] for i in range(first, first + count))
        return [{"kind": k, "ms": ms[k]} for k in picked]

    return Target(app, task, payloads, finished)


class Settles:
    """When a worker's jobs settled, read from its own counters (``worker.stats``): a job
    acknowledged (done, or skipped as a duplicate) or dead-lettered. The counters are read
    every ``SAMPLE`` seconds; the jobs that settled in between are spread evenly over that
    interval (each at the middle of its share)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.times: list[float] = []
        self._last = time.time()
        self._task: asyncio.Task[None] | None = None

    def count(self) -> int:
        """Jobs settled so far."""
        s = self.worker.stats
        return s.processed + s.duplicates_skipped + s.dead

    def failed(self) -> int:
        """Jobs dead-lettered so far."""
        return self.worker.stats.dead

    def sample(self) -> None:
        now, new = time.time(), self.count() - len(self.times)
        if new > 0:
            step = (now - self._last) / new
            self.times += [self._last + step * (i + 0.5) for i in range(new)]
        self._last = now

    def start(self) -> None:
        self._last = time.time()
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE)

    async def stop(self) -> None:
        """Stop reading; a last reading takes in what settled since the one before."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.sample()


@dataclass
class Result:
    """What the workers of one process did in one setting."""

    cpu: float = 0.0
    settled: list[float] = field(default_factory=list)  # when each job settled, in order
    finished: list[float] | None = None  # ``Target.finished``
    failed: int = 0


class InProcess:
    """One worker in this process and event loop (``memory://``)."""

    def __init__(self, target: Target, concurrency: int, prefetch: int) -> None:
        self.target = target
        self.worker = target.app.worker(concurrency=concurrency, prefetch=prefetch, grace=5.0)
        self.settles = Settles(self.worker)
        self.producer_cpu = 0.0
        self._cpu0 = 0.0

    async def start(self) -> None:
        self._cpu0 = time.process_time()
        self.settles.start()
        await self.worker.start()

    def done(self) -> int:
        return self.settles.count()

    async def stop(self) -> list[Result]:
        await self.worker.stop()
        await self.settles.stop()
        cpu = time.process_time() - self._cpu0 - self.producer_cpu
        finished = None if self.target.finished is None else list(self.target.finished)
        return [Result(max(cpu, 0.0), list(self.settles.times), finished, self.settles.failed())]

    async def close(self) -> None:
        await self.worker.stop(grace=0)
        await self.settles.stop()


class Children:
    """``count`` worker processes running ``child_main``, reporting on stdout."""

    def __init__(self, cfg: dict[str, Any], count: int, concurrency: int, prefetch: int) -> None:
        self.cfg = dict(cfg, concurrency=concurrency, prefetch=prefetch)
        self.count = count
        self.procs: list[asyncio.subprocess.Process] = []
        self.counts: list[int] = [0] * count
        self.results: list[Result | None] = [None] * count
        self.ready = [asyncio.Event() for _ in range(count)]
        self.readers: list[asyncio.Task[None]] = []
        self.producer_cpu = 0.0

    async def start(self) -> None:
        config = json.dumps(self.cfg)
        for i in range(self.count):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                CHILD_CODE,
                config,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=2**27,
            )
            self.procs.append(proc)
            self.readers.append(asyncio.get_running_loop().create_task(self._read(i, proc)))
        deadline = time.monotonic() + 60
        for i, event in enumerate(self.ready):
            while not event.is_set():
                if self.procs[i].returncode is not None or time.monotonic() > deadline:
                    code = self.procs[i].returncode
                    raise ConfigError(
                        f"a bench worker process did not start (exit status "
                        f"{code}); see its errors above"
                    )
                await asyncio.sleep(0.01)

    async def _read(self, i: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "done" in msg:
                self.counts[i] = msg["done"]
            if msg.get("ready"):
                self.ready[i].set()
            if msg.get("final"):
                self.results[i] = Result(msg["cpu"], msg["settled"], msg["finished"], msg["failed"])
        await proc.wait()

    def done(self) -> int:
        return sum(self.counts)

    async def stop(self) -> list[Result]:
        await self.close()
        results: list[Result] = []
        for i, one in enumerate(self.results):
            if one is None:
                raise ConfigError(
                    f"bench worker process {i} exited {self.procs[i].returncode} without reporting"
                )
            results.append(one)
        return results

    async def close(self) -> None:
        """Stop every child: close its stdin (it stops gracefully), kill it after 15 s."""
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
        for proc in self.procs:
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self.readers:
            await asyncio.wait(self.readers, timeout=5)


def child_main() -> None:
    """Entry point of a bench worker process: config as JSON in ``sys.argv[1]``."""
    form = "aqw bench worker %(process)d: %(levelname)s %(message)s"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=form)
    asyncio.run(_child(json.loads(sys.argv[1])))


async def _child(cfg: dict[str, Any]) -> None:
    # Reports go to the original stdout; anything the tasks print goes to stderr.
    reports = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(msg: dict[str, Any]) -> None:
        with contextlib.suppress(BrokenPipeError):  # the parent is gone
            reports.write(json.dumps(msg) + "\n")
            reports.flush()

    bench = target(cfg)
    app = bench.app
    worker = app.worker(
        concurrency=cfg["concurrency"], prefetch=cfg["prefetch"], grace=5.0, handle_signals=True
    )
    settles = Settles(worker)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    async def stop_on_eof() -> None:  # the parent closed our stdin, or is gone
        await stdin.read()
        worker.request_stop()

    async def report() -> None:
        last = -1
        while True:
            if settles.count() != last:
                last = settles.count()
                emit({"done": last})
            await asyncio.sleep(0.02)

    cpu0 = time.process_time()
    settles.start()
    await worker.start()
    emit({"ready": True})
    tasks = [loop.create_task(stop_on_eof()), loop.create_task(report())]
    await worker.wait_stopped()
    await worker.stop()
    await settles.stop()
    cpu = time.process_time() - cpu0
    for task in tasks:
        task.cancel()
    await app.close()
    emit(
        {
            "final": True,
            "cpu": cpu,
            "settled": settles.times,
            "finished": bench.finished,
            "failed": settles.failed(),
            "done": len(settles.times),
        }
    )
