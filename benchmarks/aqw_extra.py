"""aqw-only figures that the side-by-side harness does not cover, in one run:

* enqueue rate: single awaited ``enqueue`` vs ``enqueue_many`` (batches of 1,000);
* drain rate with telemetry off vs on (OpenTelemetry SDK with every span and metric
  recorded, exported to an in-memory/no-op sink), as a ratio measured in the same run,
  interleaved, median of ``--repeat``;
* drain rate on the in-process ``memory://`` broker.

Targets only 127.0.0.1:6379 db 13 (flushed before and after), stops by itself, prints a
table and writes ``benchmarks/results/aqw_extra.json``.

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


def telemetry_providers() -> tuple[Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=65536))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return tp, mp


async def flush() -> None:
    client = aioredis.from_url(URL)
    await client.flushdb()
    await client.aclose()


async def drain(broker: str, jobs: int, telemetry: bool = False) -> float:
    tp, mp = telemetry_providers() if telemetry else (None, None)
    done = 0
    finished = asyncio.Event()
    app = aqw.App(broker, queue="extra", tracer_provider=tp, meter_provider=mp)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        nonlocal done
        done += 1
        if done >= jobs:
            finished.set()

    for start in range(0, jobs, 1000):
        await noop.enqueue_many(list(range(start, min(jobs, start + 1000))))
    began = time.perf_counter()
    async with app.worker(concurrency=100):
        await asyncio.wait_for(finished.wait(), timeout=120)
        elapsed = time.perf_counter() - began
    await app.close()
    if tp is not None:
        tp.shutdown()
        mp.shutdown()
    return jobs / elapsed


async def enqueue_rates(n: int) -> tuple[float, float]:
    app = aqw.App(URL, queue="extra")

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    began = time.perf_counter()
    for i in range(n):
        await noop.enqueue(i)
    single = n / (time.perf_counter() - began)
    many_n = n * 10
    began = time.perf_counter()
    for start in range(0, many_n, 1000):
        await noop.enqueue_many(list(range(start, start + 1000)))
    many = many_n / (time.perf_counter() - began)
    await app.close()
    return single, many


async def main(jobs: int, repeat: int) -> dict[str, Any]:
    off: list[float] = []
    on: list[float] = []
    memory: list[float] = []
    singles: list[float] = []
    manys: list[float] = []
    for _ in range(repeat):
        await flush()
        single, many = await enqueue_rates(2000)
        singles.append(single)
        manys.append(many)
        await flush()
        off.append(await drain(URL, jobs, telemetry=False))
        await flush()
        on.append(await drain(URL, jobs, telemetry=True))
        await flush()
        memory.append(await drain("memory://extra", jobs))
    result = {
        "jobs": jobs,
        "repeat": repeat,
        "enqueue_single_per_s": statistics.median(singles),
        "enqueue_many_per_s": statistics.median(manys),
        "drain_telemetry_off": statistics.median(off),
        "drain_telemetry_on": statistics.median(on),
        "telemetry_on_over_off": statistics.median(on) / statistics.median(off),
        "drain_memory": statistics.median(memory),
        "runs": {"off": off, "on": on, "memory": memory, "single": singles, "many": manys},
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    result = asyncio.run(main(args.jobs, args.repeat))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"enqueue, single awaited   {result['enqueue_single_per_s']:>10,.0f} jobs/s")
    print(f"enqueue_many (1,000)      {result['enqueue_many_per_s']:>10,.0f} jobs/s")
    print(f"drain, telemetry off      {result['drain_telemetry_off']:>10,.0f} jobs/s")
    print(f"drain, telemetry on       {result['drain_telemetry_on']:>10,.0f} jobs/s"
          f"  ({100 * result['telemetry_on_over_off']:.0f}% of off)")  # fmt: skip
    print(f"drain, memory://          {result['drain_memory']:>10,.0f} jobs/s")
