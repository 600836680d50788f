"""``aqw bench``: find the worker settings that give the most jobs/s on your broker.

For every combination of ``--processes``, ``--concurrency`` and ``--prefetch`` it runs two
phases against a fresh, private queue on the broker you name:

1. **drain**: ``--jobs`` jobs are enqueued, then the workers start; jobs/s is the rate at
   which they finish (between the 10th and the 90th percentile of completions, so process
   start-up does not count);
2. **latency**: the workers keep running while jobs are offered at half that rate for
   ``--latency-seconds``; p50/p99 are their end-to-end latencies, enqueue to acknowledgement.

Per setting it also reports the workers' CPU seconds per 1,000 jobs (``time.process_time``
of the worker processes) and, on a real Redis, the server commands per job (``INFO
commandstats`` deltas, producer included, commands inside scripts counted; other clients of
the same server add noise). The recommendation is the smallest setting (fewest processes,
then concurrency, then prefetch) within 5% of the best throughput.

The jobs are synthetic (``--work noop|sleep|cpu|mix``) or one of your tasks with a sample
payload (``--app MODULE:APP --task NAME --payload JSON``: it really runs, side effects
included). Workers run in child processes (``memory://`` lives in one process, so there they
run in this one). Every key the bench writes (``aqw:{queue}:*`` on Redis) is deleted at the
end, also after Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from .app import App
from .brokers import Broker, from_url
from .brokers.redis import RedisBroker
from .errors import ConfigError
from .task import Task

__all__ = ["Point", "add_parser", "main", "recommend", "run"]

WITHIN = 0.05  # the recommendation: within 5% of the best throughput
PRELOAD_BATCH = 500
CHILD_CODE = "from aqw.bench import _child_main; _child_main()"


@dataclass(frozen=True)
class _Defaults:
    concurrency: list[int]
    prefetch: list[int]
    processes: list[int]
    jobs: int
    latency_seconds: float
    timeout: float


QUICK = _Defaults([10, 50], [0, 20], [1], jobs=300, latency_seconds=0.3, timeout=30.0)
FULL = _Defaults([10, 50, 100, 200], [0, 50], sorted({1, min(os.cpu_count() or 1, 8)}),
                 jobs=3000, latency_seconds=1.0, timeout=120.0)  # fmt: skip


# -- what the workers run ---------------------------------------------------------------------


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


def _target(cfg: dict[str, Any]) -> tuple[App, Task[Any], Payloads]:
    """The app (on the bench queue), the task and a payload maker ``(first, count)``."""
    if cfg["app"]:
        from .cli import load_app

        app = load_app(cfg["app"])
        app.broker = from_url(cfg["broker"], cfg["queue"])
        app.broker.completion_ttl = app.idempotency_ttl
        app.queue, app.broker_url = app.broker.queue, cfg["broker"]
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


class _Interrupted(Exception):
    """A signal asked the bench to stop."""


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


class _InProcess:
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


class _Children:
    """``count`` worker processes running ``_child_main``, reporting on stdout."""

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


def _child_main() -> None:
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

    app, _, _ = _target(cfg)
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


# -- measuring one setting ----------------------------------------------------------------------


@dataclass
class Point:
    """The result of one setting."""

    processes: int
    concurrency: int
    prefetch: int
    jobs_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_s_per_1k: float | None = None
    ops_per_job: float | None = None
    jobs: int = 0
    failed: int = 0
    error: str | None = None

    @property
    def label(self) -> str:
        return f"--processes {self.processes} --concurrency {self.concurrency} " \
               f"--prefetch {self.prefetch}"  # fmt: skip


async def _server_ops(broker: Broker) -> int | None:
    """Commands the Redis server has run so far (None when it cannot tell)."""
    if not isinstance(broker, RedisBroker):
        return None
    try:
        info: Any = await broker.client.info("commandstats")
    except Exception:
        return None
    return sum(int(v.get("calls", 0)) for k, v in info.items()
               if k.startswith("cmdstat_") and k != "cmdstat_info")  # fmt: skip


async def _queue_keys(broker: Broker) -> list[Any]:
    if not isinstance(broker, RedisBroker):
        return []
    return [key async for key in broker.client.scan_iter(match=broker.keys.pattern(), count=1000)]


async def _delete_queue(url: str, queue: str) -> int:
    """Delete every key of ``queue``: SCAN + DEL on Redis; forget an in-memory queue."""
    if urlsplit(url).scheme == "memory":
        from .brokers import memory

        memory._QUEUES.pop(queue, None)
        return 0
    broker = from_url(url, queue)
    try:
        keys = await _queue_keys(broker)
        if isinstance(broker, RedisBroker):
            for i in range(0, len(keys), 500):
                await broker.client.delete(*keys[i : i + 500])
        return len(keys)
    finally:
        await broker.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _drain_rate(settled_at: list[float]) -> float | None:
    t = sorted(settled_at)
    if len(t) < 2:
        return None
    lo, hi = int(0.1 * len(t)), int(0.9 * len(t)) - 1
    if hi - lo < 10 or t[hi] <= t[lo]:
        lo, hi = 0, len(t) - 1
    return (hi - lo) / (t[hi] - t[lo]) if t[hi] > t[lo] else None


async def _until(pred: Callable[[], bool], limit: float, tick: Callable[[], None]) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit:.0f}s")
        tick()
        await asyncio.sleep(0.01)


async def _measure(
    cfg: dict[str, Any], point: Point, tick: Callable[[str, int, int], None]
) -> None:
    await _delete_queue(cfg["broker"], cfg["queue"])
    app, task, payloads = _target(cfg)
    n, timeout = cfg["jobs"], cfg["timeout"]
    workers: _InProcess | _Children | None = None
    try:
        ops0 = await _server_ops(app.broker)
        for first in range(0, n, PRELOAD_BATCH):
            tick("preload", first, n)
            await app.enqueue(task, payloads(first, min(PRELOAD_BATCH, n - first)))
        if cfg["in_process"]:
            workers = _InProcess(app, point.concurrency, point.prefetch)
        else:
            workers = _Children(cfg, point.processes, point.concurrency, point.prefetch)
        await workers.start()
        w = workers
        started = time.perf_counter()
        await _until(lambda: w.done() >= n, timeout, lambda: tick("drain", w.done(), n))
        estimate = n / max(time.perf_counter() - started, 1e-3)  # sets the offered rate only

        rate = max(estimate / 2, 1.0)
        offered = max(1, min(n, int(rate * cfg["latency_seconds"])))
        phase2 = time.time()
        started, sent = time.perf_counter(), 0
        while sent < offered:
            due = min(offered, int(rate * (time.perf_counter() - started)) + 1) - sent
            if due > 0:
                cpu0 = time.process_time()
                await app.enqueue(task, payloads(n + sent, due))
                w.producer_cpu += time.process_time() - cpu0
                sent += due
            tick("latency", w.done() - n, offered)
            await asyncio.sleep(0.002)
        await _until(lambda: w.done() >= n + sent, timeout,
                     lambda: tick("latency", w.done() - n, offered))  # fmt: skip
        final = await workers.stop()
        ops1 = await _server_ops(app.broker)
    finally:
        if workers is not None:
            await workers.close()
        await app.close()
    point.jobs, point.failed = len(final.times), final.failed
    point.jobs_per_s = _drain_rate([b for a, b in final.times if a < phase2])
    latencies = [(b - a) * 1000 for a, b in final.times if a >= phase2]
    if latencies:
        point.p50_ms, point.p99_ms = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
    if point.jobs:
        point.cpu_s_per_1k = final.cpu / point.jobs * 1000
        if ops0 is not None and ops1 is not None:
            point.ops_per_job = (ops1 - ops0) / point.jobs


# -- the report ---------------------------------------------------------------------------------


def recommend(points: list[Point], within: float = WITHIN) -> tuple[Point, Point] | None:
    """(the recommended point, the best point): the smallest setting (fewest processes, then
    concurrency, then prefetch) whose throughput is within ``within`` of the best."""
    ok = [p for p in points if p.jobs_per_s]
    if not ok:
        return None
    best = max(ok, key=lambda p: p.jobs_per_s or 0.0)
    close = [p for p in ok if (p.jobs_per_s or 0.0) >= (1 - within) * (best.jobs_per_s or 0.0)]
    return min(close, key=lambda p: (p.processes, p.concurrency, p.prefetch)), best


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(points: list[Point], chosen: Point | None) -> str:
    head = (f"  {'procs':>5} {'conc':>5} {'prefetch':>8} {'jobs/s':>10} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'CPU s/1k':>9} {'ops/job':>8}")  # fmt: skip
    rows = [head]
    for p in points:
        mark = "*" if p is chosen else " "
        row = (f"{mark} {p.processes:>5} {p.concurrency:>5} {p.prefetch:>8} "
               f"{_fmt(p.jobs_per_s, ',.0f'):>10} {_fmt(p.p50_ms, '.2f'):>8} "
               f"{_fmt(p.p99_ms, '.2f'):>8} {_fmt(p.cpu_s_per_1k, '.3f'):>9} "
               f"{_fmt(p.ops_per_job, '.1f'):>8}")  # fmt: skip
        if p.error:
            row += f"  error: {p.error}"
        elif p.failed:
            row += f"  ({p.failed} jobs failed)"
        rows.append(row)
    return "\n".join(rows)


class _Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per setting else."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def _bar(self, fraction: float) -> str:
        filled = int(30 * min(max(fraction, 0.0), 1.0))
        return "[" + "#" * filled + "-" * (30 - filled) + "]"

    def tick(self, index: int, point: Point, phase: str, done: int, target: int) -> None:
        now = time.monotonic()
        if not self.tty or now - self.last < 0.1:
            return
        self.last = now
        start, width = {"preload": (0.0, 0.2), "drain": (0.2, 0.5)}.get(phase, (0.7, 0.3))
        part = start + width * done / max(target, 1)
        line = (f"{self._bar((index + part) / self.total)} {index + 1}/{self.total} "
                f"{point.label}: {phase} {done}/{target}")  # fmt: skip
        sys.stderr.write("\r" + line[:150].ljust(150))
        sys.stderr.flush()

    def point_done(self, index: int, point: Point) -> None:
        rate = point.error or f"{_fmt(point.jobs_per_s, ',.0f')} jobs/s"
        bar = self._bar((index + 1) / self.total)
        line = f"{bar} {index + 1}/{self.total} {point.label}: {rate}"
        sys.stderr.write(("\r" + line.ljust(150) if self.tty else line) + "\n")
        sys.stderr.flush()


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


# -- the command --------------------------------------------------------------------------------


DESCRIPTION = (
    "Sweep --processes x --concurrency x --prefetch on a private queue of your broker. Per "
    "setting: drain --jobs jobs (jobs/s), then offer jobs at half that rate for "
    "--latency-seconds (p50/p99 latency, enqueue to acknowledgement). Also shows the workers' "
    "CPU seconds per 1,000 jobs and, on Redis, server commands per job, and recommends the "
    "smallest setting within 5% of the best throughput. Every key of the bench queue is "
    "deleted at the end, also after Ctrl-C."
)


def _csv(values: list[int]) -> str:
    return ",".join(map(str, values))


def _list(minimum: int) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            values = sorted({int(v) for v in text.split(",") if v.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
        if not values or values[0] < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give integers >= {minimum}")
        return values

    return parse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` command to the ``aqw`` command line."""
    b = sub.add_parser("bench", help="throughput tuning: sweep processes, concurrency, prefetch",
                       description=DESCRIPTION)  # fmt: skip
    b.add_argument("--broker", help="broker URL (or AQW_BROKER; default: the app's, or memory://)")
    b.add_argument("--app", help="run a task of this app (package.module:app) instead of "
                                 "synthetic jobs")  # fmt: skip
    b.add_argument("--task", help="the task to run (with --app)")
    b.add_argument("--payload", default="null", help="its sample payload, as JSON")
    b.add_argument("--work", choices=["noop", "sleep", "cpu", "mix"], default="noop",
                   help="synthetic jobs: return, sleep, burn CPU, or each in turn")  # fmt: skip
    b.add_argument("--sleep-ms", type=float, default=10.0, help="ms a sleep job sleeps")
    b.add_argument("--cpu-ms", type=float, default=1.0, help="ms of CPU a cpu job burns")
    b.add_argument("-c", "--concurrency", type=_list(1),
                   help=f"values to try (default {_csv(FULL.concurrency)}; "
                        f"--quick: {_csv(QUICK.concurrency)})")  # fmt: skip
    b.add_argument("--prefetch", type=_list(0),
                   help=f"values to try (default {_csv(FULL.prefetch)}; "
                        f"--quick: {_csv(QUICK.prefetch)})")  # fmt: skip
    b.add_argument("-p", "--processes", type=_list(1),
                   help=f"worker process counts to try (default {_csv(FULL.processes)}; "
                        f"--quick: {_csv(QUICK.processes)})")  # fmt: skip
    b.add_argument("-n", "--jobs", type=int,
                   help=f"jobs per setting in the drain phase (default {FULL.jobs}; "
                        f"--quick: {QUICK.jobs})")  # fmt: skip
    b.add_argument("--latency-seconds", type=float,
                   help=f"length of the latency phase (default {FULL.latency_seconds}; "
                        f"--quick: {QUICK.latency_seconds})")  # fmt: skip
    b.add_argument(
        "--timeout", type=float, help=f"seconds each phase may take (default {FULL.timeout:.0f})"
    )
    b.add_argument("--queue", help="the bench queue (must be unused; default: a random name)")
    b.add_argument("--quick", action="store_true", help="a small grid, a few seconds")
    b.add_argument("--json", action="store_true", help="print the results as JSON")


def _config(args: argparse.Namespace) -> dict[str, Any]:
    grid = QUICK if args.quick else FULL
    broker = args.broker or os.environ.get("AQW_BROKER")
    payload: Any = None
    if args.app:
        from .cli import load_app

        user = load_app(args.app)
        broker = broker or user.broker_url
        if not args.task:
            if len(user.tasks) != 1:
                raise ConfigError(f"name the task to run: --task {'|'.join(sorted(user.tasks))}")
            args.task = next(iter(user.tasks))
        task = user.get_task(args.task)
        try:
            payload = task.validate(json.loads(args.payload))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--payload is not valid JSON: {exc}") from None
        except ValidationError as exc:
            raise ConfigError(f"--payload does not fit task {args.task!r}: {exc}") from None
    elif args.task:
        raise ConfigError("--task needs --app MODULE:APP")
    broker = broker or "memory://"
    in_process = urlsplit(broker).scheme == "memory"
    processes = args.processes or grid.processes
    if in_process and processes != [1]:
        print("aqw bench: memory:// lives in one process: --processes 1 only", file=sys.stderr)
        processes = [1]
    jobs = args.jobs or grid.jobs
    if jobs < 10:
        raise ConfigError("--jobs must be >= 10")
    return {
        "broker": broker, "queue": args.queue or f"aqw-bench-{uuid.uuid4().hex[:8]}",
        "app": args.app, "task": args.task, "payload": payload, "work": args.work,
        "sleep_ms": args.sleep_ms, "cpu_ms": args.cpu_ms, "in_process": in_process,
        "jobs": jobs, "timeout": args.timeout or grid.timeout,
        "latency_seconds": args.latency_seconds or grid.latency_seconds,
        "grid": [(pr, c, pf) for pr in processes
                 for c in (args.concurrency or grid.concurrency)
                 for pf in (args.prefetch if args.prefetch is not None else grid.prefetch)],
    }  # fmt: skip


async def run(args: argparse.Namespace) -> int:
    """Run ``aqw bench``; returns the exit status (0 when at least one setting ran)."""
    cfg = _config(args)
    queue = cfg["queue"]
    if args.queue:
        probe = from_url(cfg["broker"], queue)
        try:
            if await _queue_keys(probe):
                raise ConfigError(f"queue {queue!r} has keys already: the bench deletes every "
                                  "key of its queue, so name an unused one")  # fmt: skip
        finally:
            await probe.close()
    print(f"aqw bench: queue {queue} on {_redact(cfg['broker'])} (deleted at the end)",
          file=sys.stderr)  # fmt: skip
    points = [Point(pr, c, pf) for pr, c, pf in cfg["grid"]]
    progress = _Progress(len(points))
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    stopped_by: list[int] = []

    def on_signal(sig: int) -> None:
        # Cancel, and also raise from the next progress tick: on Python 3.11 a cancel that
        # lands as a redis-py send completes can be swallowed by asyncio.wait_for.
        if not stopped_by and main is not None:
            stopped_by.append(sig)
            main.cancel()

    quiet = logging.getLogger("aqw.worker")  # no start/stop lines per setting
    level = quiet.level
    quiet.setLevel(max(logging.WARNING, quiet.getEffectiveLevel()))
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # not a background job
        signals.append(signal.SIGINT)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        for i, point in enumerate(points):

            def tick(phase: str, done: int, target: int, i: int = i, point: Point = point) -> None:
                if stopped_by:
                    raise _Interrupted
                progress.tick(i, point, phase, done, target)

            try:
                with contextlib.redirect_stdout(sys.stderr):  # what tasks print (memory://)
                    await _measure(cfg, point, tick)
            except (TimeoutError, ConfigError, OSError) as exc:
                point.error = str(exc) or type(exc).__name__
            progress.point_done(i, point)
        if stopped_by:
            raise _Interrupted
    except (asyncio.CancelledError, _Interrupted):
        print("\naqw bench: interrupted; cleaning up", file=sys.stderr)
        if stopped_by:
            return 128 + stopped_by[0]
        raise
    finally:
        quiet.setLevel(level)
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        deleted = await _delete_queue(cfg["broker"], queue)
        if urlsplit(cfg["broker"]).scheme not in ("memory", "redis", "rediss", "unix"):
            print(f"aqw bench: leftover messages of queue {queue} are not deleted on this broker",
                  file=sys.stderr)  # fmt: skip
        logging.getLogger("aqw.bench").debug("deleted %d keys of queue %s", deleted, queue)
    _report(cfg, points, as_json=args.json)
    return 0 if any(p.jobs_per_s for p in points) else 1


def _report(cfg: dict[str, Any], points: list[Point], *, as_json: bool) -> None:
    picked = recommend(points)
    chosen, best = picked if picked else (None, None)
    if as_json:
        print(json.dumps({
            "queue": cfg["queue"], "broker": _redact(cfg["broker"]),
            "work": None if cfg["app"] else cfg["work"], "app": cfg["app"], "task": cfg["task"],
            "jobs": cfg["jobs"], "results": [asdict(p) for p in points],
            "best": asdict(best) if best else None,
            "recommendation": asdict(chosen) if chosen else None,
        }, indent=2))  # fmt: skip
        return
    what = f"task {cfg['task']}" if cfg["app"] else f"work={cfg['work']}"
    print(f"aqw bench: {what}, {cfg['jobs']} jobs per setting, queue {cfg['queue']} "
          f"on {_redact(cfg['broker'])}")  # fmt: skip
    print(_table(points, chosen))
    if chosen is None or best is None:
        print("no setting finished: no recommendation")
        return
    print(f"recommended: {chosen.label}  ({chosen.jobs_per_s:,.0f} jobs/s; best "
          f"{best.jobs_per_s:,.0f} jobs/s with {best.label})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m aqw.bench ...``: the ``aqw bench`` command on its own."""
    parser = argparse.ArgumentParser(prog="aqw")
    parser.add_argument("--log-level", default=os.environ.get("AQW_LOG_LEVEL", "WARNING"))
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    from .cli import CliError

    try:
        return asyncio.run(run(args))
    except (CliError, ConfigError) as exc:
        print(f"aqw: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
