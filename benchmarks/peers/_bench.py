"""Shared harness for the peer throughput benchmarks (stdlib only).

Every ``benchmarks/peers/*.py`` script implements one small adapter (a
:class:`Session`) over its library's public API and hands it to :func:`main`,
which runs the same three phases for everyone and prints ONE JSON line:

1. **drain** - enqueue ``--jobs`` jobs (untimed, 32 concurrent lanes),
   then start one in-process worker at ``--concurrency`` and time from the start
   call until the handler has counted every job: ``drain_jobs_per_s``.  With
   ``--drain-max-s S`` the drain stops counting after S seconds and the rate is
   the jobs done so far over S (``drain_jobs_done`` and a ``note`` say so): how a
   peer that is far slower than the others is measured in bounded time.
2. **enqueue** - ``--enqueue-jobs`` single awaited enqueues in a loop, after an
   untimed warm-up of 20, no worker running: ``enqueue_per_s``.
3. **latency** - the worker runs while an open-loop producer offers ``--rate``
   jobs/s for ``--duration`` s (each enqueue fired at its scheduled instant, so a
   slow enqueue cannot lower the offered rate).  The payload carries
   ``time.time()`` taken just before the enqueue call; the handler records
   ``time.time() - t`` when its work is done (so with ``--work sleep`` a latency
   includes the sleep).  p50/p99 of those, in ms.  A warm-up of 50 jobs is
   processed first so worker start-up is not counted.  With
   ``--latency-max-wait S``, a peer that has not processed every offered job S
   seconds after the last was offered could not sustain ``--rate``: its p50/p99
   are left ``null`` (percentiles of only the jobs that made it would flatter
   it) and ``note`` says how many it processed.

The work every handler does is the same for every peer: each adapter's handler
only awaits :meth:`Recorder.job`, which with ``--work noop`` (the default) just
records, and with ``--work sleep`` first awaits ``asyncio.sleep(--sleep-ms)``
(an I/O-bound job: the worker's concurrency is what makes it fast).

Each phase opens a fresh session (fresh connections) and runs between two
``FLUSHDB`` of the dedicated database (``--db``, default 13; db 0 is refused;
db 15 is avoided because aqw's SQS tests keep locks there).
Redis is always ``127.0.0.1:6379``.  Every wait is bounded (``--phase-timeout``)
and a watchdog thread hard-exits after ``--total-timeout`` printing whatever was
measured, so a script always stops by itself.  A phase that fails leaves its
figure ``null`` and adds an ``"error"`` entry; the other phases still run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any, Protocol

REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379
DEFAULT_DB = 13

PRELOAD_LANES = 32
ENQUEUE_WARMUP = 20
LATENCY_WARMUP = 50
STOP_TIMEOUT = 15.0

log = logging.getLogger("bench")


@dataclass(frozen=True)
class Config:
    jobs: int
    enqueue_jobs: int
    rate: float
    duration: float
    concurrency: int
    db: int
    phase_timeout: float
    total_timeout: float
    verbose: bool = False
    work: str = "noop"
    sleep_ms: float = 10.0
    drain_max_s: float | None = None
    latency_max_wait: float | None = None

    @property
    def work_seconds(self) -> float:
        """Seconds each job's handler sleeps (0 for ``--work noop``)."""
        return self.sleep_ms / 1e3 if self.work == "sleep" else 0.0

    @property
    def url(self) -> str:
        return f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.db}"


WORK_KINDS = ("noop", "sleep")


class Recorder:
    """Every peer's handler awaits :meth:`job`: the same work, then counted and timed."""

    def __init__(self, work_seconds: float = 0.0) -> None:
        self.work_seconds = work_seconds
        self.reset(0)

    def reset(self, target: int) -> None:
        self.target = target
        self.done = 0
        self.latencies: list[float] = []
        self.finished = asyncio.Event()

    async def job(self, t: float) -> None:
        """The handler body: sleep ``work_seconds`` when configured, then record."""
        if self.work_seconds > 0:
            await asyncio.sleep(self.work_seconds)
        self.record(t)

    def record(self, t: float) -> None:
        self.latencies.append(time.time() - t)
        self.done += 1
        if self.done >= self.target:
            self.finished.set()

    async def wait(self, seconds: float, what: str) -> None:
        try:
            await asyncio.wait_for(self.finished.wait(), seconds)
        except TimeoutError:
            raise TimeoutError(
                f"{what}: only {self.done}/{self.target} jobs processed in {seconds:.0f}s"
            ) from None


class Session(Protocol):
    """One peer's adapter.  ``enqueue`` must work before ``start_worker``."""

    async def enqueue(self, t: float) -> None: ...

    async def start_worker(self) -> None: ...

    async def stop_worker(self) -> None: ...

    async def close(self) -> None: ...


SessionFactory = Callable[[Config, Recorder], Awaitable[Session]]


def _resp(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def flush_db(db: int) -> None:
    """``SELECT db`` + ``FLUSHDB`` over a raw RESP socket (no client library needed)."""
    if db == 0:
        raise ValueError("refusing to FLUSHDB database 0")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(REDIS_HOST, REDIS_PORT), 5)
    try:
        writer.write(_resp("SELECT", str(db)) + _resp("FLUSHDB"))
        await writer.drain()
        for _ in range(2):
            line = await asyncio.wait_for(reader.readline(), 10)
            if not line.startswith(b"+OK"):
                raise RuntimeError(f"FLUSHDB on db {db} failed: {line!r}")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


async def _bounded(aw: Awaitable[Any], what: str, limit: float = STOP_TIMEOUT) -> None:
    """Await a shutdown step for at most ``limit`` s; log, don't raise, if it misbehaves."""
    log.info("%s ...", what)
    try:
        await asyncio.wait_for(aw, limit)
    except TimeoutError:
        log.warning("%s did not finish within %.0fs", what, limit)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # we are being cancelled ourselves
        log.warning("%s leaked a CancelledError from the library's shutdown", what)
    except Exception:
        log.exception("%s failed", what)
    else:
        log.info("%s done", what)


async def _close(session: Session, worker_started: bool) -> None:
    if worker_started:
        await _bounded(session.stop_worker(), "stop_worker")
    await _bounded(session.close(), "close")


async def _preload(session: Session, n: int) -> None:
    jobs = iter(range(n))

    async def lane() -> None:
        for _ in jobs:
            await session.enqueue(time.time())

    await asyncio.gather(*(lane() for _ in range(PRELOAD_LANES)))


async def phase_drain(cfg: Config, factory: SessionFactory) -> tuple[float, int]:
    """(jobs/s, jobs counted): all ``--jobs``, or those done within ``--drain-max-s``."""
    rec = Recorder(cfg.work_seconds)
    session = await factory(cfg, rec)
    started = False
    try:
        await asyncio.wait_for(_preload(session, cfg.jobs), cfg.phase_timeout)
        log.info("drain: %d jobs enqueued, starting worker", cfg.jobs)
        rec.reset(cfg.jobs)
        t0 = time.perf_counter()
        started = True
        await session.start_worker()
        if cfg.drain_max_s is None or cfg.drain_max_s >= cfg.phase_timeout:
            await rec.wait(cfg.phase_timeout, "drain")
            return cfg.jobs / (time.perf_counter() - t0), cfg.jobs
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rec.finished.wait(), cfg.drain_max_s)
        elapsed, done = time.perf_counter() - t0, rec.done
        if done == 0:
            raise TimeoutError(f"drain: no job processed in {elapsed:.0f}s")
        return done / elapsed, done
    finally:
        await _close(session, started)


async def phase_enqueue(cfg: Config, factory: SessionFactory) -> float:
    session = await factory(cfg, Recorder(cfg.work_seconds))
    try:

        async def run() -> float:
            for _ in range(ENQUEUE_WARMUP):
                await session.enqueue(time.time())
            t0 = time.perf_counter()
            for _ in range(cfg.enqueue_jobs):
                await session.enqueue(time.time())
            return cfg.enqueue_jobs / (time.perf_counter() - t0)

        return await asyncio.wait_for(run(), cfg.phase_timeout)
    finally:
        await _close(session, False)


async def phase_latency(cfg: Config, factory: SessionFactory) -> tuple[float, float] | str:
    """(p50 ms, p99 ms), or why not: the peer could not keep up (``--latency-max-wait``)."""
    rec = Recorder(cfg.work_seconds)
    session = await factory(cfg, rec)
    try:
        await session.start_worker()
        log.info("latency: worker started, warming up")
        rec.reset(LATENCY_WARMUP)
        await asyncio.wait_for(_preload(session, LATENCY_WARMUP), cfg.phase_timeout)
        await rec.wait(cfg.phase_timeout, "latency warm-up")

        total = max(1, round(cfg.rate * cfg.duration))
        rec.reset(total)
        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter()
        for i in range(total):
            delay = t0 + i / cfg.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(session.enqueue(time.time())))
        log.info("latency: %d jobs offered in %.2fs", total, time.perf_counter() - t0)
        done, pending = await asyncio.wait(tasks, timeout=cfg.phase_timeout)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                raise RuntimeError("enqueue failed during latency phase") from task.exception()
        if pending:
            raise TimeoutError(f"latency: {len(pending)} enqueues still pending")
        if cfg.latency_max_wait is not None and cfg.latency_max_wait < cfg.phase_timeout:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.finished.wait(), cfg.latency_max_wait)
            if rec.done < total:
                return (
                    f"saturated at {cfg.rate:g} jobs/s offered: {rec.done}/{total} jobs"
                    f" done {cfg.latency_max_wait:g}s after the last was offered"
                )
        await rec.wait(cfg.phase_timeout, "latency")
        lat = sorted(rec.latencies)
        return percentile(lat, 0.50) * 1e3, percentile(lat, 0.99) * 1e3
    finally:
        await _close(session, True)


def _parse(name: str, argv: list[str] | None, epilog: str | None) -> Config:
    p = argparse.ArgumentParser(description=f"{name} peer throughput benchmark", epilog=epilog)
    p.add_argument("--jobs", type=int, default=20_000, help="jobs for the drain phase")
    p.add_argument("--enqueue-jobs", type=int, default=2_000, help="jobs for the enqueue phase")
    p.add_argument("--rate", type=float, default=500.0, help="latency phase offered jobs/s")
    p.add_argument("--duration", type=float, default=5.0, help="latency phase seconds")
    p.add_argument("--concurrency", type=int, default=100, help="worker concurrency")
    p.add_argument(
        "--work", choices=WORK_KINDS, default="noop", help="what each job does (default noop)"
    )
    p.add_argument(
        "--sleep-ms", type=float, default=10.0, help="--work sleep: ms each job sleeps (10)"
    )
    p.add_argument(
        "--drain-max-s",
        type=float,
        help="stop the drain after this many s; rate = jobs done / s (default: drain all)",
    )
    p.add_argument(
        "--latency-max-wait",
        type=float,
        help="s to wait after the last offered job; not done by then = saturated, no p50/p99",
    )
    p.add_argument("--db", type=int, default=DEFAULT_DB, help="Redis db (flushed; never 0)")
    p.add_argument("--phase-timeout", type=float, default=120.0, help="seconds per phase wait")
    p.add_argument("--total-timeout", type=float, default=420.0, help="hard cap for the script")
    p.add_argument("-v", "--verbose", action="store_true", help="log phase steps to stderr")
    a = p.parse_args(argv)
    if a.db == 0:
        p.error("--db 0 is refused: the benchmark flushes its database")
    if min(a.jobs, a.enqueue_jobs, a.concurrency) < 1 or a.rate <= 0 or a.duration <= 0:
        p.error("counts, rate and duration must be positive")
    if a.sleep_ms < 0:
        p.error("--sleep-ms must be >= 0")
    if (a.drain_max_s is not None and a.drain_max_s <= 0) or (
        a.latency_max_wait is not None and a.latency_max_wait <= 0
    ):
        p.error("--drain-max-s and --latency-max-wait must be positive")
    return Config(
        jobs=a.jobs,
        enqueue_jobs=a.enqueue_jobs,
        rate=a.rate,
        duration=a.duration,
        concurrency=a.concurrency,
        db=a.db,
        phase_timeout=a.phase_timeout,
        total_timeout=a.total_timeout,
        verbose=a.verbose,
        work=a.work,
        sleep_ms=a.sleep_ms,
        drain_max_s=a.drain_max_s,
        latency_max_wait=a.latency_max_wait,
    )


class _Output:
    """The result line, printed exactly once (normally, or by the watchdog)."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        self._lock = threading.Lock()
        self._printed = False

    def emit(self) -> None:
        with self._lock:
            if not self._printed:
                self._printed = True
                sys.stdout.write(json.dumps(self.result) + "\n")
                sys.stdout.flush()


async def _run_phases(cfg: Config, factory: SessionFactory, result: dict[str, Any]) -> None:
    errors: list[str] = []
    notes: list[str] = []

    async def phase(label: str, body: Callable[[], Awaitable[None]]) -> None:
        await flush_db(cfg.db)
        log.info("%s phase: start", label)
        t0 = time.perf_counter()
        try:
            await body()
            log.info("%s phase: ok in %.1fs", label, time.perf_counter() - t0)
        except Exception as exc:
            log.exception("%s phase failed", label)
            errors.append(f"{label}: {type(exc).__name__}: {exc}")
        finally:
            await flush_db(cfg.db)

    async def drain() -> None:
        rate, done = await phase_drain(cfg, factory)
        result["drain_jobs_per_s"] = round(rate, 1)
        if done < cfg.jobs:
            result["drain_jobs_done"] = done
            notes.append(f"drain: {done}/{cfg.jobs} jobs in the {cfg.drain_max_s:g}s cap")

    async def enqueue() -> None:
        result["enqueue_per_s"] = round(await phase_enqueue(cfg, factory), 1)

    async def latency() -> None:
        measured = await phase_latency(cfg, factory)
        if isinstance(measured, str):
            notes.append(f"latency: {measured}")
            return
        p50, p99 = measured
        result["latency_p50_ms"] = round(p50, 2)
        result["latency_p99_ms"] = round(p99, 2)

    await phase("drain", drain)
    await phase("enqueue", enqueue)
    await phase("latency", latency)
    if notes:
        result["note"] = "; ".join(notes)
    if errors:
        result["error"] = "; ".join(errors)


def main(
    name: str,
    dist: str,
    factory: SessionFactory,
    deps: tuple[str, ...] = (),
    argv: list[str] | None = None,
    extra_params: dict[str, Any] | None = None,
    epilog: str | None = None,
) -> None:
    """Run all phases for ``name`` and print its JSON line.

    ``version`` is the installed version of distribution ``dist``; ``deps`` names
    client libraries whose versions are reported alongside (e.g. redis-py);
    ``extra_params`` are peer-specific settings echoed in ``params``; ``epilog``
    documents peer-specific options in ``--help``.
    """
    cfg = _parse(name, argv, epilog)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(relativeCreated)8.0fms %(message)s"
    )
    log.setLevel(logging.INFO if cfg.verbose else logging.WARNING)
    params = asdict(cfg)
    del params["phase_timeout"], params["total_timeout"], params["verbose"]
    if cfg.work != "sleep":
        del params["sleep_ms"]
    for optional in ("drain_max_s", "latency_max_wait"):
        if params[optional] is None:
            del params[optional]
    params.update(extra_params or {})
    result: dict[str, Any] = {
        "name": name,
        "drain_jobs_per_s": None,
        "enqueue_per_s": None,
        "latency_p50_ms": None,
        "latency_p99_ms": None,
        "version": metadata.version(dist),
        "deps": dist_versions(*deps),
        "params": params,
    }
    out = _Output(result)

    def watchdog() -> None:
        result["error"] = f"watchdog: killed after {cfg.total_timeout:.0f}s"
        out.emit()
        os._exit(3)

    timer = threading.Timer(cfg.total_timeout + 30, watchdog)
    timer.daemon = True
    timer.start()
    code = 0
    try:
        asyncio.run(asyncio.wait_for(_run_phases(cfg, factory, result), cfg.total_timeout))
    except BaseException as exc:  # report, never hang or die silently
        result["error"] = f"{result.get('error', '')} fatal: {type(exc).__name__}: {exc}".strip()
        code = 1
    finally:
        timer.cancel()
        out.emit()
    if "error" in result:
        code = code or 2
    sys.exit(code)


def dist_versions(*dists: str) -> str:
    """``"redis 5.3.1, hiredis 3.5.0"`` for those of ``dists`` that are installed."""
    found = []
    for dist in dists:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{dist} {metadata.version(dist)}")
    return ", ".join(found)
