"""One job's trace: by default a single `process` span with the stages as attributes; with
App(trace_detail="stages") a child span per stage as well.

Needs the otel extra (the OpenTelemetry SDK); the in-memory exporter stands in for OTLP.
"""

import asyncio
from typing import Literal

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import aqw


async def one_job(detail: Literal["job", "stages"]) -> list[str]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = aqw.App(
        "memory://", queue=f"mail-{detail}", tracer_provider=provider, trace_detail=detail
    )

    @app.task
    async def send(n: int) -> None:
        pass

    await send.enqueue(1)
    await app.worker(burst=True).run()
    await app.close()
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    process = next(s for s in spans if s.name.startswith("process "))
    stages = {k: v for k, v in (process.attributes or {}).items() if k.endswith("_ms")}
    print(detail, [s.name for s in spans])
    print("  stage attributes on process:", sorted(stages))
    return [s.name for s in spans]


async def main() -> None:
    default = await one_job("job")
    assert sorted(default) == ["process mail-job", "publish mail-job"]
    detailed = await one_job("stages")
    assert {"aqw.lease.acquire", "aqw.handler", "aqw.settle"} <= set(detailed)


if __name__ == "__main__":
    asyncio.run(main())
