"""What OpenTelemetry costs the drain rate, as ratios to telemetry off, measured in one run.

Each trial enqueues ``--jobs`` no-op jobs (untimed), then times one in-process worker at
``--concurrency`` draining them in burst mode, on the real Redis at 127.0.0.1:6379 db 13, in
a queue of its own that is deleted afterwards. The clock runs from the worker's start until
it has stopped, one metric collection has read every histogram value and every span has
reached the exporter: whatever the SDK does for these jobs, now or later, is counted.

Variants, all but ``off`` with the OpenTelemetry SDK configured: a meter provider with an
in-memory reader (collected once, after the drain) and, for the traced ones, a tracer
provider whose spans go through a ``BatchSpanProcessor`` to an exporter that counts the
``process`` spans and discards them:

- ``off``: no SDK (the API's defaults);
- ``on_100``, ``on_10``, ``on_0``: traces sampled at 100%, 10% and 0%, metrics on; for 10%
  and 0% the sampler is ``ParentBased(TraceIdRatioBased(r))`` (100% is the SDK's default,
  ``ParentBased(ALWAYS_ON)``). Every job is enqueued by its own awaited ``enqueue``, with the
  same sampler, so each job carries its own ``traceparent`` and its own sampling decision;
- ``metrics``: the meter provider only, no tracer provider.

Every trial runs in a fresh interpreter (``python -P``, ``PYTHONPATH`` set to the tree) and
the trials are interleaved: each round runs every (tree, variant) once, the trees in
alternating order from round to round, so that machine noise hits them alike. The median
of ``--repeat`` rounds is reported, with each variant's ratio to ``off`` of the same tree
and the worker process's CPU time per job (all its threads). ``--before`` adds a second
tree, e.g. a worktree of an older commit:

    git worktree add /tmp/aqw-tel-before HEAD
    python benchmarks/telemetry_bench.py --before /tmp/aqw-tel-before [--repeat 3]
    git worktree remove /tmp/aqw-tel-before

``--micro`` times only the telemetry calls a worker makes for a job (the ``process`` span,
its stages, the counters and histogram values, then one collection and every span
exported), in a loop without Redis or a worker: the per-job cost in microseconds, the
fastest of ``--repeat`` rounds in one interpreter per (tree, variant), far less at the
mercy of a busy machine than a drain. ``--batch N`` publishes the jobs N at a time, as
``enqueue_many`` does (the jobs of a batch carry the same ``traceparent``).

Bounded: every trial has a timeout; writes ``benchmarks/results/telemetry.json``
(``--micro``: ``telemetry_micro.json``; ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

URL = "redis://127.0.0.1:6379/13"
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "telemetry.json"
MICRO_RESULTS = HERE / "results" / "telemetry_micro.json"
#: variant -> (sampling ratio or None: no tracer provider, metrics on)
VARIANTS: dict[str, tuple[float | None, bool]] = {
    "off": (None, False),
    "on_100": (1.0, True),
    "on_10": (0.1, True),
    "on_0": (0.0, True),
    "metrics": (None, True),
}

TRIAL = r"""
import asyncio, json, sys, time, uuid
import redis.asyncio as aioredis
import aqw

jobs, concurrency, url, tree, variant = (
    int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
)
ratio = None if sys.argv[6] == "none" else float(sys.argv[6])
metering = sys.argv[7] == "1"
if not aqw.__file__.startswith(tree):
    raise SystemExit(f"imported {aqw.__file__}, not the tree {tree}")

tp = mp = None
process_spans = 0
if ratio is not None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Discard(SpanExporter):
        def export(self, spans):
            global process_spans
            process_spans += sum(1 for s in spans if s.name.startswith("process "))
            return SpanExportResult.SUCCESS

    if ratio >= 1.0:
        tp = TracerProvider()
    else:
        tp = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    tp.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=65536))
if metering:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])


def durations():
    data = reader.get_metrics_data()
    n = 0
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "aqw.job.duration":
                    n += sum(p.count for p in m.data.data_points)
    return n


async def main():
    queue = "tel-" + uuid.uuid4().hex[:8]
    app = aqw.App(url, queue=queue, tracer_provider=tp, meter_provider=mp)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    if tp is not None:
        numbers = iter(range(jobs))

        async def lane():
            for i in numbers:
                await noop.enqueue(i)

        await asyncio.gather(*(lane() for _ in range(32)))
    else:
        for start in range(0, jobs, 1000):
            await noop.enqueue_many(list(range(start, min(jobs, start + 1000))))
    began, cpu = time.perf_counter(), time.process_time()
    async with app.worker(concurrency=concurrency, burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 300)
    # what the SDK still has to do for these jobs is part of their cost: one collection
    # (every histogram value recorded) and every span handed to the exporter
    recorded = durations() if mp is not None else None
    if tp is not None:
        tp.force_flush()
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    processed = worker.stats.processed
    await app.close()
    client = aioredis.Redis.from_url(url)
    keys = [k async for k in client.scan_iter(match="aqw:{" + queue + "}:*", count=1000)]
    for i in range(0, len(keys), 500):
        await client.delete(*keys[i : i + 500])
    await client.aclose()
    if tp is not None:
        tp.shutdown()
    print(json.dumps({
        "processed": processed, "seconds": elapsed, "cpu_seconds": cpu,
        "process_spans": process_spans if tp is not None else None,
        "durations_recorded": recorded,
    }))

asyncio.run(main())
"""

MICRO = r"""
import gc, json, sys, time
import aqw
from aqw.telemetry import Telemetry, now_ns
from opentelemetry import metrics, trace

jobs, rounds, batch, tree = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ratio = None if sys.argv[5] == "none" else float(sys.argv[5])
metering = sys.argv[6] == "1"
if not aqw.__file__.startswith(tree):
    raise SystemExit(f"imported {aqw.__file__}, not the tree {tree}")
tp, mp = trace.NoOpTracerProvider(), metrics.NoOpMeterProvider()
if ratio is not None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    sampler = None if ratio >= 1.0 else ParentBased(TraceIdRatioBased(ratio))
    tp = TracerProvider() if sampler is None else TracerProvider(sampler=sampler)
    tp.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=65536))
if metering:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
tel = Telemetry("tel-micro", "redis", tracer_provider=tp, meter_provider=mp)


class Lease:  # what a job trace reads of a held lease
    fencing_token, waited, renewals, lost_reason = 7, 0.0, 0, None

    def __init__(self):
        self.callbacks = []

    def on_renewed(self, callback):
        self.callbacks.append(callback)

    on_lost = on_renewed


best = float("inf")
for _ in range(rounds):
    made = []
    for start in range(0, jobs, batch):
        group = [aqw.Job(task="noop", payload={"n": i}) for i in range(start, start + batch)]
        with tel.publish(group):
            pass
        made += [aqw.Job.decode(job.encode()) for job in group]
    if ratio is not None:
        tp.force_flush()
    gc.collect()
    began = time.perf_counter()
    for job in made:  # the calls of JobPath and Settler, in their order
        received = (now_ns(), now_ns()) if tel.tracing else None
        jt = tel.job(job, received)
        lease = Lease()
        if tel.metering:
            tel.observe("aqw.job.wait", max(0.0, time.time() - job.enqueued_at), job.task)
            renewed, lost = tel.lease_counters(job.task)
            lease.on_renewed(renewed)
            lease.on_lost(lost)
        jt.lease_acquired(lease, now_ns() if tel.tracing else 0)
        run = time.perf_counter()
        with jt.handler():
            pass
        tel.observe("aqw.job.duration", time.perf_counter() - run, job.task)
        jt.settled("ack")
        tel.count("aqw.jobs.processed", job.task)
        jt.end(None)
    if metering:
        reader.get_metrics_data()
    if ratio is not None:
        tp.force_flush()
    best = min(best, (time.perf_counter() - began) / len(made))
print(json.dumps({"us_per_job": best * 1e6}))
"""


def micro(tree: Path, variant: str, jobs: int, rounds: int, batch: int) -> dict[str, Any]:
    """The per-job cost of the telemetry calls alone (``--micro``)."""
    ratio, metering = VARIANTS[variant]
    root = str(tree.resolve())
    jobs -= jobs % batch
    args = [str(jobs), str(rounds), str(batch), root]
    args += ["none" if ratio is None else str(ratio), "1" if metering else "0"]
    return run_child(MICRO, args, root, f"{tree} {variant}")


def main_micro(args: argparse.Namespace, trees: dict[str, Path], variants: list[str]) -> None:
    jobs = min(args.jobs, 4000)
    costs: dict[str, dict[str, float]] = {label: {} for label in trees}
    for variant in variants:
        for label, tree in trees.items():
            us = micro(tree, variant, jobs, args.repeat, args.batch)["us_per_job"]
            costs[label][variant] = us
            print(f"{label:6} {variant:8} {us:6.1f} us/job", flush=True)
    print(f"\ntelemetry calls of {jobs:,} jobs, published {args.batch} at a time,")
    print(f"fastest of {args.repeat} rounds: us per job (over off)")
    print(f"{'variant':10}" + "".join(f"{label:>22}" for label in trees))
    for v in variants:
        cells = "".join(
            f"{costs[label][v]:>12.1f} ({costs[label][v] - costs[label]['off']:+5.1f})"
            for label in trees
        )
        print(f"{v:10}{cells}")
    summary = {"micro": True, "jobs": jobs, "batch": args.batch, "repeat": args.repeat}
    out = MICRO_RESULTS if args.out == RESULTS else args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**summary, "us_per_job": costs}, indent=2) + "\n")
    print(f"wrote {out}")


def run_child(code: str, args: list[str], root: str, what: str) -> dict[str, Any]:
    """Run ``code`` (a trial script) on the aqw of tree ``root``; its last printed line, as
    JSON. ``-P``: ``python -c`` would put the current directory (the checkout) first on
    sys.path."""
    out = subprocess.run(
        [sys.executable, "-P", "-c", code, *args],
        env={**os.environ, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{what}: exit {out.returncode}\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def trial(tree: Path, variant: str, jobs: int, concurrency: int) -> dict[str, Any]:
    ratio, metering = VARIANTS[variant]
    root = str(tree.resolve())
    args = [str(jobs), str(concurrency), URL, root, variant]
    args += ["none" if ratio is None else str(ratio), "1" if metering else "0"]
    result = run_child(TRIAL, args, root, f"{tree} {variant}")
    if result["processed"] != jobs:
        raise SystemExit(f"{tree} {variant}: processed {result['processed']} of {jobs} jobs")
    if result["durations_recorded"] not in (None, jobs):
        raise SystemExit(f"{tree} {variant}: {result['durations_recorded']} durations recorded")
    result["rate"] = jobs / result["seconds"]
    result["cpu_us"] = 1e6 * result["cpu_seconds"] / jobs
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent, help="the tree to measure")
    parser.add_argument("--before", type=Path, help="a baseline tree, measured alongside")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--micro", action="store_true", help="the telemetry calls alone")
    parser.add_argument("--batch", type=int, default=1, help="--micro: jobs per publish")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown or "off" not in variants:
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}, including off")
    trees = {"after": args.tree} if args.before is None else {"before": args.before}
    if args.before is not None:
        trees["after"] = args.tree
    if args.micro:
        main_micro(args, trees, variants)
        return
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        label: {v: [] for v in variants} for label in trees
    }
    for i in range(args.repeat):
        order = list(trees.items())
        if i % 2:  # the second of a pair runs warmer or colder: alternate who goes first
            order.reverse()
        for variant in variants:
            for label, tree in order:
                result = trial(tree, variant, args.jobs, args.concurrency)
                runs[label][variant].append(result)
                rate, cpu = result["rate"], result["cpu_us"]
                print(
                    f"round {i + 1} {label:6} {variant:8} {rate:>8,.0f} jobs/s"
                    f" {cpu:5.0f} us CPU/job",
                    flush=True,
                )
    summary: dict[str, dict[str, Any]] = {}
    for label in trees:
        med = {v: statistics.median(r["rate"] for r in runs[label][v]) for v in variants}
        cpu = {v: statistics.median(r["cpu_us"] for r in runs[label][v]) for v in variants}
        summary[label] = {
            v: {
                "jobs_per_s": med[v],
                "over_off": med[v] / med["off"],
                "cpu_us_per_job": cpu[v],
                "sampled": [
                    r["process_spans"] / args.jobs
                    for r in runs[label][v]
                    if r["process_spans"] is not None
                ],
            }
            for v in variants
        }
    print(f"\n{args.jobs:,} no-op jobs, concurrency {args.concurrency}, median of {args.repeat}")
    print(f"{'variant':10}" + "".join(f"{label + ' (of off, CPU/job)':>32}" for label in trees))
    for v in variants:
        cells = ""
        for label in trees:
            s = summary[label][v]
            rate, ratio, cpu_us = s["jobs_per_s"], 100 * s["over_off"], s["cpu_us_per_job"]
            cells += f"{rate:>12,.0f} ({ratio:3.0f}%, {cpu_us:4.0f} us)"
        print(f"{v:10}{cells}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "jobs": args.jobs,
                "concurrency": args.concurrency,
                "repeat": args.repeat,
                "trees": {k: str(v.resolve()) for k, v in trees.items()},
                "summary": summary,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
