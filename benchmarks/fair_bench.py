"""Fair shares in aqw: what a fairness key costs the drain, with 10,000 keys waiting.

On the real Redis at 127.0.0.1:6379 db 13 (``--url``), each trial in a fresh interpreter, in
a queue of its own whose keys are deleted afterwards (never a ``FLUSHDB``): ``--jobs`` no-op
jobs are enqueued with ``enqueue_many`` before the clock starts, then one worker
(``--concurrency``, burst mode) drains them. Two variants of the same task, trials
interleaved plain, fair, plain, fair ... (``--repeat`` rounds):

- **plain**: no fairness key;
- **fair**: ``fairness_key`` = one of ``--keys`` keys (``n % keys``, 10,000 by default), so
  every fetch picks across 10,000 active keys in ``fair_fetch.lua``.

The medians, the ratio fair / plain (goal >= 0.90: a pick costs no more than ~10% of the
drain), the worker's CPU time per job and the Redis server's CPU per job are reported.

    python benchmarks/fair_bench.py [--jobs 20000] [--repeat 3] [--concurrency 100]
                                    [--keys 10000] [--json fair.json]

Bounded: every trial has a timeout (its process group is killed past it), and the script
stops by itself; a minute or two with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

# The CPU meters of the results benchmark, its sibling (this file's folder is on sys.path,
# whether run by hand or as its own child).
from limits_bench import delete_keys, run_trial
from results_bench import cpu_seconds, redis_cpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
URL = "redis://127.0.0.1:6379/13"
VARIANTS = ("plain", "fair")
GOAL = 0.90


# -- the child: one trial in a fresh interpreter -----------------------------------------------


async def child_drain(spec: dict[str, Any]) -> dict[str, Any]:
    import redis.asyncio as aioredis

    import aqw

    url, queue, jobs, variant = spec["url"], spec["queue"], spec["jobs"], spec["variant"]
    app = aqw.App(url, queue=queue)
    keys = spec["keys"]
    options: dict[str, Any] = {
        "plain": {},
        "fair": {"fairness_key": lambda n: f"t{n % keys}"},
    }[variant]

    @app.task(name="noop", **options)
    async def noop(n: int) -> None:
        return None

    for start in range(0, jobs, 1000):
        await noop.enqueue_many(list(range(start, min(jobs, start + 1000))))
    probe = aioredis.Redis.from_url(url)
    redis_before = await redis_cpu(probe)
    cpu_before = cpu_seconds()
    began = time.perf_counter()
    async with app.worker(concurrency=spec["concurrency"], burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), spec["timeout"])
    elapsed = time.perf_counter() - began
    cpu = cpu_seconds() - cpu_before
    redis_used = await redis_cpu(probe) - redis_before
    await probe.aclose()
    await app.close()
    return {
        "processed": worker.stats.processed,
        "deferred": worker.stats.deferred,
        "seconds": elapsed,
        "worker_cpu_s": cpu,
        "redis_cpu_s": redis_used,
    }


# -- the parent: trials, bounds, clean-up ------------------------------------------------------


def log(msg: str) -> None:
    print(f"[fair_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def trial(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    queue = f"fb-{variant}-{uuid.uuid4().hex[:8]}"
    spec = {
        "url": args.url,
        "queue": queue,
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "variant": variant,
        "keys": args.keys,
        "timeout": args.trial_timeout,
    }
    try:
        got = run_trial(spec, args.trial_timeout + 60, Path(__file__))
    finally:
        delete_keys(args.url, queue)
    if got["processed"] != args.jobs:
        raise RuntimeError(f"{variant}: processed {got['processed']} of {args.jobs} jobs")
    return {
        "jobs_per_s": args.jobs / got["seconds"],
        "worker_cpu_us_per_job": 1e6 * got["worker_cpu_s"] / args.jobs,
        "redis_cpu_us_per_job": 1e6 * got["redis_cpu_s"] / args.jobs,
        "deferred": got["deferred"],
    }


def summarise(trials: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": trials}
    for variant, rows in trials.items():
        out[variant] = {
            field: round(statistics.median(r[field] for r in rows), 1)
            for field in ("jobs_per_s", "worker_cpu_us_per_job", "redis_cpu_us_per_job")
        }
        out[variant]["deferred"] = sum(r["deferred"] for r in rows)
    plain = out["plain"]["jobs_per_s"]
    for variant in ("fair",):
        out[f"{variant}_over_plain"] = round(out[variant]["jobs_per_s"] / plain, 3)
        pairs = zip(trials["plain"], trials[variant], strict=True)
        out[f"{variant}_over_plain_per_round"] = [
            round(b["jobs_per_s"] / a["jobs_per_s"], 3) for a, b in pairs
        ]
    return out


def print_report(report: dict[str, Any]) -> None:
    p, s = report["params"], report["drain"]
    print(f"aqw fairness benchmark, {report['generated_at']}, {p['url']}")
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}")
    print(
        f"drain: {p['jobs']:,} no-op jobs, concurrency {p['concurrency']}, median of"
        f" {p['repeat']} interleaved trials, {p['keys']:,} fairness keys"
    )
    print(
        f"  {'variant':<8} {'jobs/s':>9} {'worker CPU us/job':>18} {'Redis CPU us/job':>17}"
        f" {'deferred':>9}"
    )
    for variant in VARIANTS:
        d = s[variant]
        rates = ", ".join(f"{t['jobs_per_s']:,.0f}" for t in s["trials"][variant])
        print(
            f"  {variant:<8} {d['jobs_per_s']:>9,.0f} {d['worker_cpu_us_per_job']:>18.1f}"
            f" {d['redis_cpu_us_per_job']:>17.1f} {d['deferred']:>9}   trials: {rates}"
        )
    for variant in ("fair",):
        rounds = ", ".join(f"{x:.3f}" for x in s[f"{variant}_over_plain_per_round"])
        print(
            f"  {variant} / plain: {s[f'{variant}_over_plain']:.3f} (per round: {rounds});"
            f" goal >= {GOAL:.2f}"
        )


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        result = asyncio.run(child_drain(json.loads(sys.argv[2])))
        aqw = sys.modules["aqw"]  # which tree it measured
        result["aqw_dir"] = os.path.dirname(os.path.abspath(aqw.__file__ or ""))
        print(json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per trial")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the two variants")
    parser.add_argument("--keys", type=int, default=10_000, help="fairness keys")
    parser.add_argument("--concurrency", type=int, default=100, help="worker concurrency")
    parser.add_argument("--url", default=URL, help=f"the Redis (default {URL})")
    parser.add_argument("--trial-timeout", type=float, default=300.0, help="seconds per trial")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = parser.parse_args()
    if args.jobs < 1 or args.repeat < 1 or args.concurrency < 1:
        parser.error("--jobs, --repeat and --concurrency must be positive")
    report: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python benchmarks/limits_bench.py " + " ".join(sys.argv[1:]),
        "params": {k: getattr(args, k) for k in ("jobs", "repeat", "concurrency", "url", "keys")},
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    trials: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.repeat):
        for variant in VARIANTS:
            got = trial(args, variant)
            trials[variant].append(got)
            log(f"round {r + 1} {variant}: {got['jobs_per_s']:,.0f} jobs/s")
    report["drain"] = summarise(trials)
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    ok = report["drain"]["fair_over_plain"] >= GOAL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
