"""The worker side of ``aqw bench``: the jobs it runs (synthetic, or a task of your app), and
the workers that run them, counting when each job settled: one in this process
(``memory://``) or child processes that report their counts as JSON lines on stdout."""

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
from ...brokers import Broker
from ...errors import ConfigError
from ...task import Task

CHILD_CODE = "from aqw.cli.bench._worker import child_main; child_main()"


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


def target(cfg: dict[str, Any]) -> tuple[App, Task[Any], Payloads]:
    """The app (on the bench queue), the task and a payload maker ``(first, count)``."""
    if cfg["app"]:
        from .._main import load_app

        app = load_app(cfg["app"])
        app.use_broker(cfg["broker"], cfg["queue"])
        task = app.get_task(cfg["task"])
        sample = cfg["payload"]
        return app, task, lambda first, count: [sample] * count
    app = App(cfg["broker"], queue=cfg["queue"])
    task = app.task(name="aqw_bench")(_synthetic)
    kinds = ["noop", "sleep", "cpu"] if cfg["work"] == "mix" else [cfg["work"]]
    ms = {"noop": 0.0, "sleep": cfg["sleep_ms"], "cpu": cfg["cpu_ms"]}

    def payloads(first: int, count: int) -> list[Any]:
        picked = (kinds[i % len(kinds)] for i in range(first, first + count))
        return [{"kind": k, "ms": ms[k]} for k in picked]

    return app, task, payloads


class _Probe:
    """Counts settled jobs and when they settled, by wrapping the broker's settle steps."""

    def __init__(self, broker: Broker) -> None:
        self.times: list[tuple[float, float]] = []  # (enqueued at, settled at)
        self.failed = 0
        ack, dead_letter = broker.ack, broker.dead_letter

        async def counted_ack(delivery: Any, lease: Any) -> bool:
            ok = await ack(delivery, lease)
            if ok and delivery.job is not None:
                self.times.append((delivery.job.enqueued_at, time.time()))
            return ok

        async def counted_dead_letter(
            delivery: Any, failure: Any, attempts: int, lease: Any
        ) -> bool:
            ok = await dead_letter(delivery, failure, attempts, lease)
            if ok and delivery.job is not None:
                self.failed += 1
                self.times.append((delivery.job.enqueued_at, time.time()))
            return ok

        broker.ack = counted_ack  # type: ignore[method-assign]
        broker.dead_letter = counted_dead_letter  # type: ignore[method-assign]


@dataclass
class _Final:
    cpu: float = 0.0
    times: list[tuple[float, float]] = field(default_factory=list)
    failed: int = 0


class InProcess:
    """One worker in this process and event loop (``memory://``)."""

    def __init__(self, app: App, concurrency: int, prefetch: int) -> None:
        self.app = app
        self.probe = _Probe(app.broker)
        self.worker = app.worker(concurrency=concurrency, prefetch=prefetch, grace=5.0)
        self.producer_cpu = 0.0
        self._cpu0 = 0.0

    async def start(self) -> None:
        self._cpu0 = time.process_time()
        await self.worker.start()

    def done(self) -> int:
        return len(self.probe.times)

    async def stop(self) -> _Final:
        await self.worker.stop()
        cpu = time.process_time() - self._cpu0 - self.producer_cpu
        return _Final(max(cpu, 0.0), list(self.probe.times), self.probe.failed)

    async def close(self) -> None:
        await self.worker.stop(grace=0)


class Children:
    """``count`` worker processes running ``child_main``, reporting on stdout."""

    def __init__(self, cfg: dict[str, Any], count: int, concurrency: int, prefetch: int) -> None:
        self.cfg = dict(cfg, concurrency=concurrency, prefetch=prefetch)
        self.count = count
        self.procs: list[asyncio.subprocess.Process] = []
        self.counts: list[int] = [0] * count
        self.finals: list[_Final | None] = [None] * count
        self.ready = [asyncio.Event() for _ in range(count)]
        self.readers: list[asyncio.Task[None]] = []
        self.producer_cpu = 0.0

    async def start(self) -> None:
        config = json.dumps(self.cfg)
        for i in range(self.count):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CHILD_CODE, config,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=2**27,
            )  # fmt: skip
            self.procs.append(proc)
            self.readers.append(asyncio.get_running_loop().create_task(self._read(i, proc)))
        deadline = time.monotonic() + 60
        for i, event in enumerate(self.ready):
            while not event.is_set():
                if self.procs[i].returncode is not None or time.monotonic() > deadline:
                    code = self.procs[i].returncode
                    raise ConfigError(f"a bench worker process did not start (exit status "
                                      f"{code}); see its errors above")  # fmt: skip
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
                times = [(a, b) for a, b in msg["times"]]
                self.finals[i] = _Final(msg["cpu"], times, msg["failed"])
        await proc.wait()

    def done(self) -> int:
        return sum(self.counts)

    async def stop(self) -> _Final:
        await self.close()
        final = _Final()
        for i, one in enumerate(self.finals):
            if one is None:
                raise ConfigError(f"bench worker process {i} exited {self.procs[i].returncode} "
                                  "without reporting")  # fmt: skip
            final.cpu += one.cpu
            final.times += one.times
            final.failed += one.failed
        return final

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

    app, _, _ = target(cfg)
    probe = _Probe(app.broker)
    worker = app.worker(concurrency=cfg["concurrency"], prefetch=cfg["prefetch"], grace=5.0,
                        handle_signals=True)  # fmt: skip
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    async def stop_on_eof() -> None:  # the parent closed our stdin, or is gone
        await stdin.read()
        worker.request_stop()

    async def report() -> None:
        last = -1
        while True:
            if len(probe.times) != last:
                last = len(probe.times)
                emit({"done": last})
            await asyncio.sleep(0.02)

    cpu0 = time.process_time()
    await worker.start()
    emit({"ready": True})
    tasks = [loop.create_task(stop_on_eof()), loop.create_task(report())]
    await worker.wait_stopped()
    await worker.stop()
    cpu = time.process_time() - cpu0
    for task in tasks:
        task.cancel()
    await app.close()
    emit({"final": True, "cpu": cpu, "times": probe.times, "failed": probe.failed,
          "done": len(probe.times)})  # fmt: skip
