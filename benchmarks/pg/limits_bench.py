"""What a limit costs a job that is never held back, on aqw's PostgreSQL broker: the drain
of no-op jobs, plain, with ``rate_limit="1000000/s"`` (far above what one worker reaches:
only the check is paid) and with ``concurrency_key`` over 100 keys and ``max_per_key=10``,
each variant in a fresh process, interleaved rounds, medians.

    python benchmarks/pg/limits_bench.py [--dsn DSN] [--jobs N] [--repeat R]

A limited job starts alone, in one call of ``aqw_start_limited`` (one transaction); a plain
one in the batched start (``start_many.sql``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

import aqw

VARIANTS = ("plain", "rate", "caps")


async def drain(dsn: str, variant: str, jobs: int) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    app = aqw.App(f"{dsn}?schema={schema}&pool=20", queue="bench")
    options: dict[str, Any] = {}
    if variant == "rate":
        options = {"rate_limit": "1000000/s"}
    elif variant == "caps":
        options = {"concurrency_key": lambda p: p % 100, "max_per_key": 10}

    @app.task(name="noop", **options)
    async def noop(n: int) -> None: ...

    try:
        await app.broker.connect()
        for i in range(0, jobs, 500):
            await noop.enqueue_many(list(range(i, min(i + 500, jobs))))
        worker = app.worker(concurrency=100, burst=True)
        t0 = time.perf_counter()
        await worker.run()
        took = time.perf_counter() - t0
        return {
            "variant": variant,
            "jobs": worker.stats.processed,
            "drain": round(worker.stats.processed / took),
            "deferred": worker.stats.deferred,
        }
    finally:
        await app.close()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", choices=VARIANTS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(asyncio.run(drain(args.dsn, args.variant, args.jobs))))
        return
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            cmd = [sys.executable, str(Path(__file__)), "--dsn", args.dsn]
            cmd += ["--jobs", str(args.jobs), "--variant", variant]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain = statistics.median(r["drain"] for r in runs["plain"])
    for variant, found in runs.items():
        rate = statistics.median(r["drain"] for r in found)
        deferred = sum(r["deferred"] for r in found)
        print(
            f"{variant:6} {rate:8,.0f} jobs/s  {rate / plain:6.1%} of plain  "
            f"(runs {[r['drain'] for r in found]}, deferred {deferred})"
        )


if __name__ == "__main__":
    main()
