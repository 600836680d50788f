"""Batch children against plain jobs, in one run, on the real Redis (127.0.0.1:6379 db 13):
what a job pays for counting in a batch, and how soon a batch's callback starts.

Each trial enqueues ``--jobs`` no-op jobs, either plain (``enqueue_many``) or as children of
``--jobs / --per-batch`` batches (``batch.enqueue_many``), before the clock starts; then one
worker drains them at ``--concurrency`` (burst mode). Trials alternate (plain, batch, plain,
...) so machine noise hits both alike; the medians of ``--repeat`` trials are reported with
the Redis commands per job (``INFO commandstats``, commands inside scripts included). Then
``--rounds`` batches of 10 children, one at a time on a running worker: the time from the
last child's end to the callback's start, both from their records (the server's clock).

    python benchmarks/batch_bench.py [--jobs 10000] [--per-batch 100] [--repeat 3]

Bounded: every drain has a timeout, and the queues are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import redis.asyncio as aioredis

import aqw

URL = "redis://127.0.0.1:6379/13"


async def _commands(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_"))


async def trial(kind: str, jobs: int, per_batch: int, concurrency: int) -> dict[str, Any]:
    queue = f"bb-{uuid.uuid4().hex[:8]}"
    app = aqw.App(URL, queue=queue)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    @app.task(name="callback")
    async def callback() -> None:
        return None

    ids: list[str] = []
    if kind == "plain":
        for start in range(0, jobs, 1000):
            await noop.enqueue_many(list(range(start, min(jobs, start + 1000))))
    else:
        for start in range(0, jobs, per_batch):
            async with app.batch(on_complete=callback) as batch:
                await batch.enqueue_many(noop, list(range(start, min(jobs, start + per_batch))))
            ids.append(batch.id)
    client = aioredis.Redis.from_url(URL)
    before = await _commands(client)
    began = time.perf_counter()
    async with app.worker(concurrency=concurrency, burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 300)
    elapsed = time.perf_counter() - began
    commands = await _commands(client) - before
    await app.close()
    keys = [k async for k in client.scan_iter(match="aqw:{" + queue + "}:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    processed = worker.stats.processed - len(ids)
    return {"rate": processed / elapsed, "commands_per_job": commands / (processed + len(ids))}


async def callback_lag(rounds: int, children: int) -> list[float]:
    """Seconds from a batch's last child's end to its callback's start (both the server's
    clock, from their records), one small batch at a time on an otherwise idle worker."""
    queue = f"bb-{uuid.uuid4().hex[:8]}"
    app = aqw.App(URL, queue=queue)
    started = asyncio.Event()

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    @app.task(name="callback")
    async def callback() -> None:
        started.set()

    lags = []
    async with app.worker(concurrency=children):
        for _ in range(rounds):
            started.clear()
            async with app.batch(on_complete=callback) as batch:
                await batch.enqueue_many(noop, list(range(children)))
            await asyncio.wait_for(started.wait(), 30)
            info = await app.batch_info(batch.id)
            assert info is not None
            ends = [
                await app.job(c) for c in await app.broker.batches.children(batch.id, 0, children)
            ]  # type: ignore[union-attr]
            last = max(i.finished_at.timestamp() for i in ends if i and i.finished_at)
            record = await app.job(info.callbacks["complete"])
            assert record is not None and record.started_at is not None
            lags.append(record.started_at.timestamp() - last)
    client = aioredis.Redis.from_url(URL)
    keys = [k async for k in client.scan_iter(match="aqw:{" + queue + "}:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    await app.close()
    return sorted(lags)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--per-batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=50, help="batches timed for the lag")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "batch": []}
    for _ in range(args.repeat):
        for kind in runs:
            runs[kind].append(await trial(kind, args.jobs, args.per_batch, args.concurrency))
    out = {}
    for kind, trials in runs.items():
        out[kind] = {
            k: statistics.median(t[k] for t in trials if t[k] is not None)
            for k in trials[0]
            if any(t[k] is not None for t in trials)
        }
    out["batch/plain rate"] = out["batch"]["rate"] / out["plain"]["rate"]
    lags = await callback_lag(args.rounds, 10)
    out["callback start after the last child, ms"] = {
        "p50": 1000 * lags[len(lags) // 2],
        "p99": 1000 * lags[min(len(lags) - 1, int(len(lags) * 0.99))],
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
