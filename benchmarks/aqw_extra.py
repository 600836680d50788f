"""aqw-only figures that the side-by-side harness does not cover, in one run:

* enqueue rate: single awaited ``enqueue`` vs ``enqueue_many`` (batches of 1,000);
* drain rate (concurrency 100, no-op jobs) with telemetry off vs on, as ratios measured in
  the same run, interleaved, median of ``--repeat``. The "on" variants have the
  OpenTelemetry SDK configured, metrics on (in-memory reader) and spans exported to a
  discarding exporter through a ``BatchSpanProcessor``; their time includes what the SDK
  still does for the drain after the last job ran (one collection, a span flush):

  - ``on``: every trace sampled (the SDK's default sampler, 100%);
  - ``sampled_10``: ``ParentBased(TraceIdRatioBased(0.1))``, 10% of traces sampled. The
    jobs are enqueued one by one by a producer with the same sampler (each job its own
    ``publish`` span, as jobs enqueued from separate requests are), so the worker follows
    an independent 10% decision per job; the fraction actually sampled is reported;
  - ``metrics_only``: the SDK's meter provider only, no tracer provider (tracing off);

* drain rate on the in-process ``memory://`` broker.

Targets only 127.0.0.1:6379 db 13 (flushed before each step and at the end), every wait is
bounded (``--timeout`` for the whole run), prints a table and writes
``benchmarks/results/aqw_extra.json`` (``--out``).

    python benchmarks/aqw_extra.py [--jobs 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

import aqw

URL = "redis://127.0.0.1:6379/13"
RESULTS = Path(__file__).parent / "results" / "aqw_extra.json"
QUEUE = "extra"
SAMPLED_RATIO = 0.1
DRAIN_TIMEOUT = 120.0
ENQUEUE_LANES = 32

#: telemetry variants of the Redis drain: label -> sampler ratio (None: telemetry off)
VARIANTS: dict[str, float | None] = {
    "off": None,
    "on": 1.0,
    "sampled_10": SAMPLED_RATIO,
    "metrics_only": 1.0,
}
#: variants with metrics on and tracing off
METRICS_ONLY = {"metrics_only"}


class Telemetry:
    """SDK providers for one drain, and a count of the ``process`` spans that reached export."""

    def __init__(self, ratio: float) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        outer = self
        self.process_spans = 0

        class Discard(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                outer.process_spans += sum(1 for s in spans if s.name.startswith("process "))
                return SpanExportResult.SUCCESS

        if ratio >= 1.0:
            self.tp = TracerProvider()  # the SDK default: ParentBased(ALWAYS_ON)
        else:
            self.tp = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        self.tp.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=65536))
        self.reader = InMemoryMetricReader()
        self.mp = MeterProvider(metric_readers=[self.reader])

    def settle(self) -> float:
        """Seconds the SDK takes to finish its work for the drain: one collection (every
        histogram value recorded) and every span handed to the exporter."""
        began = time.perf_counter()
        self.reader.get_metrics_data()
        self.tp.force_flush()
        return time.perf_counter() - began

    def shutdown(self) -> None:
        self.tp.shutdown()  # exports what is still queued, so process_spans is complete
        self.mp.shutdown()


async def flush() -> None:
    client = aioredis.from_url(URL)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


async def drain(
    broker: str, jobs: int, ratio: float | None = None, traces: bool = True
) -> tuple[float, float | None]:
    """(jobs/s, fraction of jobs whose trace was sampled; None with telemetry off)."""
    tel = Telemetry(ratio) if ratio is not None else None
    done = 0
    finished = asyncio.Event()
    app = aqw.App(
        broker,
        queue=QUEUE,
        tracer_provider=tel.tp if tel and traces else None,
        meter_provider=tel.mp if tel else None,
    )

    @app.task(name="noop")
    async def noop(n: int) -> None:
        nonlocal done
        done += 1
        if done >= jobs:
            finished.set()

    try:
        if ratio is not None and ratio < 1.0:
            # one publish span per job: an independent sampling decision per job
            numbers = iter(range(jobs))

            async def lane() -> None:
                for i in numbers:
                    await noop.enqueue(i)

            await asyncio.gather(*(lane() for _ in range(ENQUEUE_LANES)))
        else:
            for start in range(0, jobs, 1000):
                await noop.enqueue_many(list(range(start, min(jobs, start + 1000))))
        began = time.perf_counter()
        async with app.worker(concurrency=100):
            await asyncio.wait_for(finished.wait(), timeout=DRAIN_TIMEOUT)
            elapsed = time.perf_counter() - began
        if tel is not None:  # what the SDK still owes these jobs is part of their cost
            elapsed += tel.settle()
    finally:
        await app.close()
        if tel is not None:
            tel.shutdown()
    return jobs / elapsed, (tel.process_spans / jobs if tel else None)


async def enqueue_rates(n: int) -> tuple[float, float]:
    app = aqw.App(URL, queue=QUEUE)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    try:
        began = time.perf_counter()
        for i in range(n):
            await noop.enqueue(i)
        single = n / (time.perf_counter() - began)
        many_n = n * 10
        began = time.perf_counter()
        for start in range(0, many_n, 1000):
            await noop.enqueue_many(list(range(start, start + 1000)))
        many = many_n / (time.perf_counter() - began)
    finally:
        await app.close()
    return single, many


async def measure(jobs: int, repeat: int) -> dict[str, Any]:
    drains: dict[str, list[float]] = {label: [] for label in VARIANTS}
    sampled: dict[str, list[float]] = {
        label: [] for label in VARIANTS if VARIANTS[label] and label not in METRICS_ONLY
    }
    memory: list[float] = []
    singles: list[float] = []
    manys: list[float] = []
    try:
        for _ in range(repeat):
            await flush()
            single, many = await enqueue_rates(2000)
            singles.append(single)
            manys.append(many)
            for label, ratio in VARIANTS.items():
                await flush()
                rate, fraction = await drain(URL, jobs, ratio, label not in METRICS_ONLY)
                drains[label].append(rate)
                if label in sampled and fraction is not None:
                    sampled[label].append(fraction)
            memory.append((await drain(f"memory://{QUEUE}", jobs))[0])
    finally:
        await flush()
    med = {label: statistics.median(v) for label, v in drains.items()}
    return {
        "jobs": jobs,
        "repeat": repeat,
        "concurrency": 100,
        "enqueue_single_per_s": statistics.median(singles),
        "enqueue_many_per_s": statistics.median(manys),
        "enqueue_many_over_single": statistics.median(manys) / statistics.median(singles),
        "drain_telemetry_off": med["off"],
        "drain_telemetry_on": med["on"],
        "telemetry_on_over_off": med["on"] / med["off"],
        "drain_telemetry_sampled_10": med["sampled_10"],
        "telemetry_sampled_10_over_off": med["sampled_10"] / med["off"],
        "drain_metrics_only": med["metrics_only"],
        "metrics_only_over_off": med["metrics_only"] / med["off"],
        "sampled_fraction": {k: statistics.median(v) for k, v in sampled.items()},
        "drain_memory": statistics.median(memory),
        "runs": {
            **drains,
            "memory": memory,
            "single": singles,
            "many": manys,
            "sampled_fraction": sampled,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--timeout", type=float, default=900.0, help="hard cap, seconds")
    args = parser.parse_args()
    if args.jobs < 1 or args.repeat < 1:
        parser.error("--jobs and --repeat must be positive")

    async def bounded() -> dict[str, Any]:
        return await asyncio.wait_for(measure(args.jobs, args.repeat), args.timeout)

    result = asyncio.run(bounded())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    frac = result["sampled_fraction"]
    print(f"enqueue, single awaited   {result['enqueue_single_per_s']:>10,.0f} jobs/s")
    print(f"enqueue_many (1,000)      {result['enqueue_many_per_s']:>10,.0f} jobs/s")
    print(f"drain, telemetry off      {result['drain_telemetry_off']:>10,.0f} jobs/s")
    print(
        f"drain, telemetry on       {result['drain_telemetry_on']:>10,.0f} jobs/s"
        f"  ({100 * result['telemetry_on_over_off']:.0f}% of off,"
        f" {100 * frac['on']:.0f}% of traces sampled)"
    )
    print(
        f"drain, telemetry on, 10%  {result['drain_telemetry_sampled_10']:>10,.0f} jobs/s"
        f"  ({100 * result['telemetry_sampled_10_over_off']:.0f}% of off,"
        f" {100 * frac['sampled_10']:.1f}% of traces sampled)"
    )
    print(
        f"drain, metrics only       {result['drain_metrics_only']:>10,.0f} jobs/s"
        f"  ({100 * result['metrics_only_over_off']:.0f}% of off, tracing off)"
    )
    print(f"drain, memory://          {result['drain_memory']:>10,.0f} jobs/s")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
