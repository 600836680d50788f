"""Tracing through OpenTelemetry: a producer span per enqueue, a consumer span per job with
children for the lease, the handler and the settle step, in the producer's trace.

Here an in-memory exporter collects the spans; in production use an OTLP exporter.
Needs the otel extra: pip install -e '.[otel]' from a checkout, or
pip install 'aqw[otel] @ git+https://<your git host>/aqw.git' (aqw is not on a package index yet).
"""

import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import aqw

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
app = aqw.App("memory://", queue="mail", tracer_provider=provider)
tracer = provider.get_tracer("docs")


@app.task
async def send(n: int, ctx: aqw.Context) -> None:
    with tracer.start_as_current_span("smtp.send"):  # nests under aqw.handler
        async with ctx.lock("smtp-pool", wait=1.0):  # traced as "aqw.lock smtp-pool"
            pass


async def main() -> None:
    with tracer.start_as_current_span("POST /signup"):
        await send.enqueue(1)
    await app.worker(burst=True).run()

    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    def depth(span):  # how many ancestors it has
        return 0 if span.parent is None else 1 + depth(by_id[span.parent.span_id])

    for span in sorted(spans, key=lambda s: (s.start_time, depth(s))):
        attrs = {k: v for k, v in span.attributes.items() if k.startswith(("aqw.", "messaging.op"))}
        print("  " * depth(span) + span.name, attrs)
    assert len({s.context.trace_id for s in spans}) == 1  # one trace, producer to settle
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
