"""Measuring one setting of ``aqw bench``: drain a preloaded queue (jobs/s), then offer jobs
at half that rate (latency), on a fresh queue; also the Redis helpers that find and delete
the bench queue's keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...brokers import Broker, from_url
from ...brokers.memory import delete_memory_queue
from ._worker import Children, InProcess, Result, target

PRELOAD_BATCH = 500


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
        return (
            f"--processes {self.processes} --concurrency {self.concurrency} "
            f"--prefetch {self.prefetch}"
        )


async def _server_ops(broker: Broker) -> int | None:
    """Commands the broker's server has run so far (None when it cannot tell)."""
    return None if broker.server is None else await broker.server.commands_run()


async def delete_queue(url: str, queue: str) -> int:
    """Delete every key of ``queue`` on its server (SCAN + DEL on Redis); forget an
    in-memory queue."""
    if urlsplit(url).scheme == "memory":
        delete_memory_queue(queue)
        return 0
    broker = from_url(url, queue)
    try:
        return 0 if broker.server is None else await broker.server.delete_queue()
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


def _latencies(results: list[Result], phase2: float, sent_at: list[float], n: int) -> list[float]:
    """Latencies (ms) of the latency phase's jobs, enqueue to settle. The settle times come
    from the workers' counters; which job each one belongs to, from the order the bench's
    jobs finished in each process, or, for a task of your app, from the order the jobs were
    offered (the k-th settle after the drain is the k-th job offered)."""
    if all(r.finished is not None for r in results):
        pairs = (pair for r in results for pair in zip(r.finished or [], r.settled, strict=False))
        return [(done - at) * 1000 for at, done in pairs if at >= phase2]
    settled = sorted(t for r in results for t in r.settled)[n:]
    return [(done - at) * 1000 for at, done in zip(sent_at, settled, strict=False)]


async def measure(cfg: dict[str, Any], point: Point, tick: Callable[[str, int, int], None]) -> None:
    """Run one setting on a fresh queue and fill in ``point``'s results; ``tick(phase, done,
    target)`` is called as it goes (progress; it may raise to stop the bench)."""
    await delete_queue(cfg["broker"], cfg["queue"])
    bench = target(cfg)
    app, task, payloads = bench.app, bench.task, bench.payloads
    n, timeout = cfg["jobs"], cfg["timeout"]
    workers: InProcess | Children | None = None
    try:
        ops0 = await _server_ops(app.broker)
        for first in range(0, n, PRELOAD_BATCH):
            tick("preload", first, n)
            await app.enqueue(task, payloads(first, min(PRELOAD_BATCH, n - first)))
        if cfg["in_process"]:
            workers = InProcess(bench, point.concurrency, point.prefetch)
        else:
            workers = Children(cfg, point.processes, point.concurrency, point.prefetch)
        await workers.start()
        w = workers
        started = time.perf_counter()
        await _until(lambda: w.done() >= n, timeout, lambda: tick("drain", w.done(), n))
        estimate = n / max(time.perf_counter() - started, 1e-3)  # sets the offered rate only

        rate = max(estimate / 2, 1.0)
        offered = max(1, min(n, int(rate * cfg["latency_seconds"])))
        sent_at: list[float] = []  # when each job of the latency phase was enqueued
        phase2 = time.time()
        started, sent = time.perf_counter(), 0
        while sent < offered:
            due = min(offered, int(rate * (time.perf_counter() - started)) + 1) - sent
            if due > 0:
                cpu0 = time.process_time()
                at = time.time()
                await app.enqueue(task, payloads(n + sent, due))
                w.producer_cpu += time.process_time() - cpu0
                sent_at += [at] * due
                sent += due
            tick("latency", w.done() - n, offered)
            await asyncio.sleep(0.002)
        await _until(
            lambda: w.done() >= n + sent, timeout, lambda: tick("latency", w.done() - n, offered)
        )
        results = await workers.stop()
        ops1 = await _server_ops(app.broker)
    finally:
        if workers is not None:
            await workers.close()
        await app.close()
    settled = sorted(t for r in results for t in r.settled)
    point.jobs, point.failed = len(settled), sum(r.failed for r in results)
    point.jobs_per_s = _drain_rate(settled[:n])  # the latency phase starts once n settled
    latencies = _latencies(results, phase2, sent_at, n)
    if latencies:
        point.p50_ms, point.p99_ms = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
    if point.jobs:
        point.cpu_s_per_1k = sum(r.cpu for r in results) / point.jobs * 1000
        if ops0 is not None and ops1 is not None:
            point.ops_per_job = (ops1 - ops0) / point.jobs


# -- the report ---------------------------------------------------------------------------------
