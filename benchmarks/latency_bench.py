"""Latency (enqueue -> handler start) at a steady rate, aqw next to a raw Streams loop.

Each trial starts a worker process, waits until it is consuming, then starts a producer
process that offers ``--rate`` jobs/s for ``--seconds`` s, open loop (each enqueue fired at
its scheduled instant, one awaited enqueue at a time; a late one does not push the others
back). Every job carries ``time.time()`` taken just before its enqueue call; the handler
records ``time.time() - t`` as its first statement. The jobs of the first second are a
warm-up and are not counted. The worker reports p50/p90/p99/max in ms, and the garbage
collections it saw after the warm-up (``gc.callbacks``): count and longest pause per
generation, and how many of the slowest 1% of jobs were waiting while a collection ran.

Systems and variants (``--variants``, comma-separated, ``system[+option...]``):

- ``aqw``: ``app.worker(concurrency=--concurrency)`` in the worker process, lease on,
  telemetry off; the producer is an ``App`` doing ``await task.enqueue(t)``;
- ``raw``: a raw redis-py Streams loop, the minimum: the producer ``XADD``s ``{"t": t}``;
  the worker reads with ``XREADGROUP COUNT <free slots> BLOCK``, runs a task per message
  (at most ``--concurrency``), and one acker task sends the finished ids as pipelined
  ``XACK``s;
- options: ``uvloop`` (the worker runs on uvloop), ``freeze`` (``gc.freeze()`` once the
  worker has started), ``gcN`` (``gc.set_threshold(N, 10, 10)``), ``nogc``
  (``gc.disable()``, a bound on what any GC tuning can win), ``probe`` (a task that sleeps
  1 ms over and over and records the loop's stalls, wake-ups more than 2 ms late, and how
  many of the slowest 1% of jobs were waiting during one, and the process's CPU time during
  the stalls: far below their length means the process was not running; it keeps the loop
  busy, which changes the figures too).

``--loop uvloop``, ``--gc-freeze`` and ``--gc-threshold N`` add the ``aqw`` variant with
that option to the list. Trials are interleaved (every variant once per round, the order
reversed each round: A B B A ...), each in fresh processes; the median over ``--trials``
rounds of each figure is reported. The real Redis at 127.0.0.1:6379 db 14, each trial in
keys of its own that are deleted afterwards; every wait is bounded.

    python benchmarks/latency_bench.py                                # aqw, raw; 3 rounds
    python benchmarks/latency_bench.py --loop uvloop --gc-freeze --trials 5
    python benchmarks/latency_bench.py --variants aqw,aqw+uvloop+freeze,raw,raw+uvloop

``--tree DIR`` imports aqw from another source tree (e.g. ``git archive HEAD aqw | tar -x -C
DIR``), so that a tree being edited does not change the code under test mid-run; with
``--tree-b DIR2``, a variant ending in ``@b`` (``aqw@b``, ``aqw+uvloop@b``) imports DIR2's:
two trees side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

URL = "redis://127.0.0.1:6379/14"
ROOT = Path(__file__).resolve().parent.parent
WARMUP_S = 1.0
TRIAL_TIMEOUT = 120.0
STALL = 0.002

# -- worker side ---------------------------------------------------------------------------


class Record:
    """Latencies of the counted jobs and the garbage collections seen meanwhile."""

    def __init__(self, expected: int, warmup: int) -> None:
        self.expected = expected
        self.warmup = warmup
        self.seen = 0
        self.latencies: list[tuple[float, float]] = []  # (enqueued at, latency)
        self.done = asyncio.Event()
        self.since = float("inf")
        self.pauses: list[tuple[int, float, float]] = []  # (generation, start, end)
        self.stalls: list[tuple[float, float]] = []  # loop wake-ups > STALL late: (due, woke)
        self.stalled_cpu = 0.0  # the process's CPU seconds during the stalls
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.time()
        else:
            self.pauses.append((int(info["generation"]), self._gc_start, time.time()))

    def job(self, t: float) -> None:
        now = time.time()
        self.seen += 1
        if self.seen == self.warmup + 1:
            self.since = now
        if self.seen > self.warmup:
            self.latencies.append((t, now - t))
        if self.seen >= self.expected:
            self.done.set()

    async def probe(self) -> None:
        """Sleep 1 ms again and again; a wake-up late by more than STALL ms is a stall of
        the loop (something ran that long without yielding)."""
        while True:
            due, cpu = time.time() + 0.001, time.process_time()
            await asyncio.sleep(0.001)
            woke = time.time()
            if woke - due > STALL and self.seen > self.warmup:
                self.stalls.append((due, woke))
                self.stalled_cpu += time.process_time() - cpu

    def report(self) -> dict[str, Any]:
        gc.callbacks.remove(self._on_gc)
        lat = sorted(ms for _, ms in self.latencies)
        n = len(lat)

        def q(p: float) -> float:
            return lat[min(n - 1, int(p * n))] * 1000 if n else float("nan")

        p99 = q(0.99) / 1000
        slow = [(t, t + d) for t, d in self.latencies if d >= p99]
        in_gc = sum(
            1
            for start, end in slow
            if any(g_start < end and g_end > start for _, g_start, g_end in self.pauses)
        )
        in_stall = sum(
            1 for start, end in slow if any(s < end and e > start for s, e in self.stalls)
        )
        stalled = sum(e - s for s, e in self.stalls)
        gens: dict[str, Any] = {
            "slow_in_stall": in_stall,
            "stalls": len(self.stalls),
            "stalled_ms": round(stalled * 1000, 1),
            "stalled_cpu_ms": round(self.stalled_cpu * 1000, 1),
        }
        for gen in (0, 1, 2):
            times = [(e - s) * 1000 for g, s, e in self.pauses if g == gen and s >= self.since]
            gens[f"gc{gen}_n"] = len(times)
            gens[f"gc{gen}_max_ms"] = round(max(times), 2) if times else 0.0
        return {
            "jobs": n,
            "p50": q(0.50),
            "p90": q(0.90),
            "p99": q(0.99),
            "max": lat[-1] * 1000 if n else float("nan"),
            "slow_in_gc": in_gc,
            "slow": len(slow),
            **gens,
        }


async def aqw_worker(queue: str, concurrency: int, rec: Record, ready: Callable[[], None]) -> None:
    import aqw

    app = aqw.App(URL, queue=queue)

    @app.task(name="lat")
    async def lat(t: float) -> None:
        rec.job(t)

    async with app.worker(concurrency=concurrency):
        ready()
        await asyncio.wait_for(rec.done.wait(), TRIAL_TIMEOUT)
    await app.close()


async def raw_worker(queue: str, concurrency: int, rec: Record, ready: Callable[[], None]) -> None:
    stream, group = f"lat:{{{queue}}}:stream", "g"
    client = aioredis.from_url(URL)
    await client.xgroup_create(stream, group, id="0", mkstream=True)
    slots = asyncio.Semaphore(concurrency)
    to_ack: list[bytes] = []
    ack_wanted = asyncio.Event()
    running: set[asyncio.Task[None]] = set()

    async def run_one(msg_id: bytes, fields: dict[bytes, bytes]) -> None:
        try:
            rec.job(float(fields[b"t"]))
        finally:
            to_ack.append(msg_id)
            ack_wanted.set()
            slots.release()

    async def reader() -> None:
        while True:
            await slots.acquire()
            free = 1
            while free < 100 and not slots.locked():
                await slots.acquire()
                free += 1
            reply = await client.xreadgroup(group, "c", {stream: ">"}, count=free, block=1000)
            got = 0
            for _, messages in reply or ():
                for msg_id, fields in messages:
                    got += 1
                    task = asyncio.create_task(run_one(msg_id, fields))
                    running.add(task)
                    task.add_done_callback(running.discard)
            for _ in range(free - got):
                slots.release()

    async def acker() -> None:
        nonlocal to_ack
        while True:
            await ack_wanted.wait()
            ack_wanted.clear()
            ids, to_ack = to_ack, []
            async with client.pipeline(transaction=False) as pipe:
                for i in range(0, len(ids), 100):
                    pipe.xack(stream, group, *ids[i : i + 100])
                await pipe.execute()

    loops = [asyncio.create_task(reader()), asyncio.create_task(acker())]
    ready()
    try:
        await asyncio.wait_for(rec.done.wait(), TRIAL_TIMEOUT)
    finally:
        for task in loops:
            task.cancel()
        await asyncio.wait(loops, timeout=5)
        await client.aclose()


def worker_main(args: argparse.Namespace) -> None:
    system, options = parse_variant(args.variant)
    threshold = next((int(o[2:]) for o in options if o.startswith("gc") and o[2:].isdigit()), 0)
    if threshold:
        gc.set_threshold(threshold, 10, 10)
    if "nogc" in options:
        gc.disable()
    rec = Record(args.jobs, args.warmup)

    def ready() -> None:
        if "freeze" in options:
            gc.collect()
            gc.freeze()
        print("ready", flush=True)

    run = aqw_worker if system == "aqw" else raw_worker

    async def coro() -> None:
        probe = asyncio.create_task(rec.probe()) if "probe" in options else None
        await run(args.queue, args.concurrency, rec, ready)
        if probe is not None:
            probe.cancel()

    if "uvloop" in options:
        import uvloop

        uvloop.run(coro())
    else:
        asyncio.run(coro())
    print(json.dumps(rec.report()), flush=True)


# -- producer side -------------------------------------------------------------------------


async def produce(system: str, queue: str, rate: float, jobs: int) -> None:
    if system == "aqw":
        import aqw

        app = aqw.App(URL, queue=queue)

        @app.task(name="lat")
        async def lat(t: float) -> None:
            return None

        async def send(t: float) -> None:
            await lat.enqueue(t)

        close: Any = app.close
    else:
        client = aioredis.from_url(URL, max_connections=10_000)
        stream = f"lat:{{{queue}}}:stream"

        async def send(t: float) -> None:
            await client.xadd(stream, {"t": repr(t)})

        close = client.aclose
    await send(time.time())  # connect; this job is counted by the worker as a warm-up one
    sent: list[asyncio.Task[None]] = []
    start = time.monotonic()
    for i in range(1, jobs):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sent.append(asyncio.create_task(send(time.time())))
    results = await asyncio.wait_for(asyncio.gather(*sent, return_exceptions=True), 30)
    await close()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:  # the worker would wait for them: end the trial with an error instead
        raise SystemExit(f"{len(failed)} enqueues failed, e.g. {failed[0]!r}")


def producer_main(args: argparse.Namespace) -> None:
    asyncio.run(produce(args.system, args.queue, args.rate, args.jobs))


# -- the runner ----------------------------------------------------------------------------


def parse_variant(text: str) -> tuple[str, list[str]]:
    system, *options = text.removesuffix("@b").split("+")
    if system not in ("aqw", "raw"):
        raise SystemExit(f"variant {text!r}: the system is aqw or raw")
    for o in options:
        threshold = o.startswith("gc") and o[2:].isdigit()
        if o not in ("uvloop", "freeze", "nogc", "probe") and not threshold:
            raise SystemExit(f"variant {text!r}: unknown option {o!r}")
    return system, options


async def delete_keys(queue: str) -> None:
    client = aioredis.from_url(URL)
    for pattern in (f"aqw:{{{queue}}}:*", f"lat:{{{queue}}}:*"):
        keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
    await client.aclose()


def trial(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    system, _ = parse_variant(variant)
    queue = "lat-" + uuid.uuid4().hex[:8]
    jobs = int(args.rate * args.seconds)
    tree = args.tree_b if variant.endswith("@b") else args.tree
    if tree is None:
        raise SystemExit(f"variant {variant!r}: give the second tree with --tree-b")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    me = [sys.executable, "-P", str(Path(__file__).resolve())]
    common = ["--queue", queue, "--jobs", str(jobs)]
    own = ["--variant", variant, "--concurrency", str(args.concurrency)]
    own += ["--warmup", str(int(args.rate * WARMUP_S))]
    worker = subprocess.Popen(
        [*me, "_worker", *common, *own],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{variant}: the worker did not start")
        subprocess.run(
            [*me, "_producer", *common, "--system", system, "--rate", str(args.rate)],
            env=env,
            timeout=args.seconds + 60,
            check=True,
        )
        out, _ = worker.communicate(timeout=TRIAL_TIMEOUT)
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        asyncio.run(delete_keys(queue))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("role", nargs="?", default="run", choices=["run", "_worker", "_producer"])
    p.add_argument("--rate", type=float, default=500.0, help="jobs offered per second")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds the producer runs")
    p.add_argument("--trials", type=int, default=3, help="interleaved rounds (median)")
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--variants", default="aqw,raw", help="e.g. aqw,aqw+uvloop,raw")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--gc-freeze", action="store_true", help="add aqw+freeze")
    p.add_argument("--gc-threshold", type=int, default=0, metavar="N", help="add aqw+gcN")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--tree", type=Path, default=ROOT, help="the aqw source tree to import")
    p.add_argument("--tree-b", type=Path, help="a second tree, for the variants ending in @b")
    # the worker's and the producer's own arguments
    p.add_argument("--queue", help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--system", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "_worker":
        return worker_main(args)
    if args.role == "_producer":
        return producer_main(args)
    run(args)


def run(args: argparse.Namespace) -> None:
    variants = [v for v in args.variants.split(",") if v]
    if args.loop == "uvloop":
        variants.append("aqw+uvloop")
    if args.gc_freeze:
        variants.append("aqw+freeze")
    if args.gc_threshold:
        variants.append(f"aqw+gc{args.gc_threshold}")
    for v in variants:
        parse_variant(v)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.trials):
        for v in variants if r % 2 == 0 else variants[::-1]:
            try:
                res = trial(v, args)
            except (RuntimeError, subprocess.SubprocessError, ValueError, IndexError) as exc:
                print(f"round {r + 1} {v}: failed: {exc!r}", file=sys.stderr, flush=True)
                continue
            results[v].append(res)
            print(
                f"round {r + 1} {v:<22} p50 {res['p50']:6.2f}  p99 {res['p99']:6.2f}  "
                f"max {res['max']:6.1f} ms  gc2 {res['gc2_n']} (max {res['gc2_max_ms']} ms)  "
                f"slow in gc {res['slow_in_gc']}/{res['slow']}",
                file=sys.stderr,
                flush=True,
            )
    table = summarize(results)
    print(f"\n{args.rate:g} jobs/s for {args.seconds:g} s, median of {args.trials} rounds")
    print("| variant | p50 ms | p90 ms | p99 ms | max ms | p99 / raw p99 |")
    print("|---|---|---|---|---|---|")
    raw = table.get("raw", {}).get("p99")
    for v, row in table.items():
        ratio = f"{row['p99'] / raw:.2f}" if raw else "-"
        print(
            f"| {v} | {row['p50']:.2f} | {row['p90']:.2f} | {row['p99']:.2f} "
            f"| {row['max']:.1f} | {ratio} |"
        )
    if args.out:
        args.out.write_text(json.dumps({"summary": table, "trials": results}, indent=1) + "\n")


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for v, rows in results.items():
        if not rows:
            continue
        table[v] = {
            k: statistics.median(row[k] for row in rows) for k in ("p50", "p90", "p99", "max")
        }
    return table


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
