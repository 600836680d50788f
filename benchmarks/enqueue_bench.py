"""Enqueue rate of aqw against raw redis-py loops, side by side in one run.

Six variants, each trial a fresh interpreter producing on its own (no worker running), on
the real Redis at 127.0.0.1:6379 db 12, in a queue (or stream) of its own that is deleted
afterwards:

- ``aqw-single``: ``await task.enqueue(n)``, one coroutine awaiting each in turn;
- ``raw-single``: ``await r.xadd(stream, {"j": body})``, likewise;
- ``aqw-single-c100`` / ``raw-single-c100``: the same from 100 concurrent producers;
- ``aqw-many``: ``await task.enqueue_many(batch)``, batches of 1,000;
- ``raw-many``: 1,000 ``XADD`` in one non-transactional pipeline per batch.

Trials are interleaved (each round runs every variant once, starting one further along
each time, every other round in reverse order), and the median of ``--repeat`` trials per
variant is reported with the ratios aqw / raw. ``--tree`` (repeatable) also measures the
aqw variants of other source trees in the same rounds (a "before" copy of ``aqw/``), each
trial with ``PYTHONPATH`` set to its tree. Each aqw trial also reads the server's
``INFO commandstats`` before and after, and reports the EVALSHA microseconds per job
(others' commands on the same server add noise). Besides the medians, ``by round`` is the
median of each trial's rate over the raw trial of its round, and ``cpu us/job`` the
producer's own CPU time per job (``process_time``), which moves less with the machine's
load than a rate does. ``--url`` points the trials at a private ``redis-server`` (no one
else's commands in its figures).

    python benchmarks/enqueue_bench.py [--jobs 20000] [--repeat 3] [--tree /tmp/aqw-before]
        [--url redis://127.0.0.1:PORT/12]

Bounded: every trial has a timeout and the script stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

URL = "redis://127.0.0.1:6379/12"
BATCH = 1000
PRODUCERS = 100
HERE = Path(__file__).resolve().parent.parent

TRIAL = r"""
import asyncio, json, sys, time, uuid
import redis.asyncio as aioredis

variant, jobs, url, tree = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
BATCH, PRODUCERS = int(sys.argv[5]), int(sys.argv[6])
BODY = json.dumps({"v": 1, "id": uuid.uuid4().hex, "task": "noop", "payload": 12345,
    "attempt": 1, "enqueued_at": time.time(), "headers": {}, "key": None,
    "expires_at": None}, separators=(",", ":")).encode()


async def evalsha_stats(client):
    info = await client.info("commandstats")
    row = info.get("cmdstat_evalsha", {})
    return int(row.get("calls", 0)), int(row.get("usec", 0))


async def producers(count, n, one):
    per = n // count
    async def producer(p):
        for i in range(per):
            await one(p * per + i)
    await asyncio.gather(*(producer(p) for p in range(count)))
    return per * count


async def run_aqw(kind):
    import aqw
    if tree and not aqw.__file__.startswith(tree):
        raise SystemExit(f"imported {aqw.__file__}, not the tree {tree}")
    queue = "enqb-" + uuid.uuid4().hex[:8]
    app = aqw.App(url, queue=queue)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    client = aioredis.Redis.from_url(url)
    try:
        for i in range(200):  # warm up: connections, scripts, caches
            await noop.enqueue(i)
        await noop.enqueue_many(list(range(BATCH)))
        before = await evalsha_stats(client)
        began, cpu = time.perf_counter(), time.process_time()
        if kind == "single":
            for i in range(jobs):
                await noop.enqueue(i)
            done = jobs
        elif kind == "single-c100":
            done = await producers(PRODUCERS, jobs, noop.enqueue)
        else:
            done = 0
            while done < jobs:
                await noop.enqueue_many(list(range(done, done + BATCH)))
                done += BATCH
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
        after = await evalsha_stats(client)
        calls, usec = after[0] - before[0], after[1] - before[1]
        depth = await app.broker.depth()
        await app.close()
    finally:
        keys = [k async for k in client.scan_iter(match="aqw:{" + queue + "}:*", count=1000)]
        for i in range(0, len(keys), 1000):
            await client.delete(*keys[i : i + 1000])
        await client.aclose()
    if depth.waiting != done + 200 + BATCH:
        raise SystemExit(f"{depth.waiting} jobs waiting, expected {done + 200 + BATCH}")
    return {"jobs": done, "seconds": elapsed, "cpu": cpu, "evalsha_calls": calls,
        "evalsha_usec": usec}


async def run_raw(kind):
    stream = "enqb-raw-" + uuid.uuid4().hex[:8]
    client = aioredis.Redis.from_url(url)
    try:
        for i in range(200):
            await client.xadd(stream, {"j": BODY})
        began, cpu = time.perf_counter(), time.process_time()
        if kind == "single":
            for i in range(jobs):
                await client.xadd(stream, {"j": BODY})
            done = jobs
        elif kind == "single-c100":
            done = await producers(PRODUCERS, jobs, lambda i: client.xadd(stream, {"j": BODY}))
        else:
            done = 0
            while done < jobs:
                pipe = client.pipeline(transaction=False)
                for _ in range(BATCH):
                    pipe.xadd(stream, {"j": BODY})
                await pipe.execute()
                done += BATCH
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
        length = await client.xlen(stream)
    finally:
        await client.delete(stream)
        await client.aclose()
    if length != done + 200:
        raise SystemExit(f"{length} entries, expected {done + 200}")
    return {"jobs": done, "seconds": elapsed, "cpu": cpu}


who, _, kind = variant.partition("-")
result = asyncio.run(run_aqw(kind) if who == "aqw" else run_raw(kind))
print(json.dumps(result))
"""

KINDS = ("single", "single-c100", "many")


def trial(variant: str, tree: Path | None, jobs: int, url: str) -> dict[str, float]:
    env = dict(os.environ)
    root = tree.resolve() if tree is not None else HERE
    env["PYTHONPATH"] = str(root)
    # -P: no current directory on sys.path, so the tree named is the one imported.
    command = [sys.executable, "-P", "-c", TRIAL, variant, str(jobs), url, str(root)]
    out = subprocess.run(
        [*command, str(BATCH), str(PRODUCERS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"trial {variant} ({root}) failed:\n{out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["rate"] = result["jobs"] / result["seconds"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per trial")
    parser.add_argument("--repeat", type=int, default=3, help="trials per variant")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another tree")
    parser.add_argument("--only", choices=KINDS, action="append", help="measure these kinds")
    parser.add_argument("--url", default=URL)
    parser.add_argument("--json", type=Path, help="write every trial here")
    args = parser.parse_args()
    kinds = args.only or list(KINDS)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    trees += [(str(t), t) for t in args.tree]
    cells: list[tuple[str, str, Path | None]] = []
    for kind in kinds:
        cells.append((f"raw-{kind}", "raw", None))
        for label, tree in trees:
            cells.append((f"aqw-{kind}", label, tree))
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    began = time.time()
    load = os.getloadavg()
    for r in range(args.repeat):
        shift = r % len(cells)
        order = cells[shift:] + cells[:shift]
        if r % 2:  # every other round backwards: no variant always runs right after another
            order.reverse()
        for variant, label, tree in order:
            res = trial(variant, tree, args.jobs, args.url)
            results.setdefault((variant, label), []).append(res)
            print(f"round {r + 1} {variant:16} {label:24} {res['rate']:9,.0f} jobs/s", flush=True)
    print(f"\n{args.jobs:,} jobs per trial, median of {args.repeat}, load before {load[0]:.2f}")
    print(
        f"{'variant':16} {'tree':24} {'jobs/s':>9} {'of raw':>7} {'by round':>8}"
        f" {'cpu us/job':>10} {'evalsha us/job':>15}"
    )
    for kind in kinds:
        raws = results[(f"raw-{kind}", "raw")]
        raw = statistics.median(x["rate"] for x in raws)
        cpu = statistics.median(x["cpu"] / x["jobs"] * 1e6 for x in raws)
        print(f"{'raw-' + kind:16} {'raw':24} {raw:9,.0f} {'':7} {'':8} {cpu:10.1f}")
        for label, _ in trees:
            runs = results[(f"aqw-{kind}", label)]
            rate = statistics.median(x["rate"] for x in runs)
            # Each trial against the raw trial of its own round: less of the drift of load.
            pairs = zip(runs, raws, strict=True)
            paired = statistics.median(x["rate"] / y["rate"] for x, y in pairs)
            cpu = statistics.median(x["cpu"] / x["jobs"] * 1e6 for x in runs)
            lua = statistics.median(x["evalsha_usec"] / x["jobs"] for x in runs)
            print(
                f"{'aqw-' + kind:16} {label:24} {rate:9,.0f} {rate / raw:7.0%} {paired:8.0%}"
                f" {cpu:10.1f} {lua:15.2f}"
            )
    print(f"wall {time.time() - began:.0f} s, load after {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        rows = [
            {"variant": v, "tree": label, **res}
            for (v, label), runs in results.items()
            for res in runs
        ]
        args.json.write_text(json.dumps({"jobs": args.jobs, "trials": rows}, indent=1))


if __name__ == "__main__":
    main()
