"""Drain rate of two aqw source trees, side by side in one run: did a change slow the job path?

Each trial enqueues ``--jobs`` no-op jobs (``enqueue_many``, before the clock starts), then
times one worker process draining them at ``--concurrency`` (burst mode), on the real Redis
at 127.0.0.1:6379 db 13, in a queue of its own that is deleted afterwards. Trials alternate
between the trees (A B A B ...) so that machine noise hits both alike; the median of
``--repeat`` trials per tree is reported, and the ratio B/A.

    git worktree add /tmp/aqw-before <commit>
    python benchmarks/drain_ab.py --a /tmp/aqw-before --b . [--jobs 20000] [--repeat 3]

Each trial runs in a fresh interpreter with ``PYTHONPATH`` set to the tree, so the two trees
never share imported code. Bounded: every trial has a timeout, and the script stops itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

URL = "redis://127.0.0.1:6379/13"

TRIAL = r"""
import asyncio, json, sys, time, uuid
import redis.asyncio as aioredis
import aqw

async def main(jobs: int, concurrency: int) -> None:
    queue = "ab-" + uuid.uuid4().hex[:8]
    app = aqw.App(URL, queue=queue)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    for start in range(0, jobs, 1000):
        await noop.enqueue_many(list(range(start, min(jobs, start + 1000))))
    began = time.perf_counter()
    async with app.worker(concurrency=concurrency, burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 300)
    elapsed = time.perf_counter() - began
    processed = worker.stats.processed
    await app.close()
    client = aioredis.Redis.from_url(URL)
    keys = [k async for k in client.scan_iter(match="aqw:{" + queue + "}:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    print(json.dumps({"processed": processed, "seconds": elapsed}))

URL = sys.argv[3]
if not aqw.__file__.startswith(sys.argv[4]):
    raise SystemExit(f"imported {aqw.__file__}, not the tree {sys.argv[4]}")
asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


def trial(tree: Path, jobs: int, concurrency: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    # -P: `python -c` would put the current directory first on sys.path, and a run from a
    # checkout would import that checkout's aqw on both sides. The trial checks what it got.
    out = subprocess.run(
        [sys.executable, "-P", "-c", TRIAL, str(jobs), str(concurrency), URL, str(tree.resolve())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["processed"] != jobs:
        raise SystemExit(f"{tree}: processed {result['processed']} of {jobs} jobs")
    return float(jobs / result["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="the baseline tree")
    parser.add_argument("--b", type=Path, required=True, help="the tree to compare")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"a": [], "b": []}
    for i in range(args.repeat):
        for label in ("a", "b"):
            rate = trial(getattr(args, label), args.jobs, args.concurrency)
            rates[label].append(rate)
            print(f"trial {i + 1} {label}: {rate:,.0f} jobs/s", flush=True)
    a, b = statistics.median(rates["a"]), statistics.median(rates["b"])
    print(f"median a ({args.a}): {a:,.0f} jobs/s")
    print(f"median b ({args.b}): {b:,.0f} jobs/s")
    print(f"b / a: {b / a:.3f}")


if __name__ == "__main__":
    main()
