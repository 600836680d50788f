"""Batches and flows in telemetry, read back from the SDK's in-memory exporter and reader:
a callback's ``process`` span links to its batch's ``aqw.batch.open`` span, a flow step's to
its flow's ``aqw.flow.start`` span; ``aqw.batches.completed`` (by outcome) and
``aqw.batch.duration`` once per batch, whatever callbacks it has; plain jobs get neither."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import aqw
import aqw.telemetry
from aqw.telemetry import BATCH_TRACE_HEADER
from tests.conftest import Backend, open_backend

pytestmark = pytest.mark.timeout(60)

BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]
#: Providers stay referenced: aqw caches instruments per meter provider.
_ALIVE: list[Any] = []


class Otel:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tp = TracerProvider()
        self.tp.add_span_processor(SimpleSpanProcessor(self.exporter))
        while True:
            self.reader = InMemoryMetricReader()
            self.mp = MeterProvider(metric_readers=[self.reader])
            _ALIVE.append(self.mp)
            if id(self.mp) not in aqw.telemetry._instruments.INSTRUMENTS:
                break
        _ALIVE.append(self.tp)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.reader.get_metrics_data()
        out: list[tuple[dict[str, Any], Any]] = []
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        out.extend((dict(p.attributes or {}), p) for p in metric.data.data_points)
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.tp.shutdown()
    o.mp.shutdown()


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    async with open_backend(request.param, queue_name) as b:
        yield b


def _wire(app: aqw.App) -> dict[str, aqw.Task[Any]]:
    @app.task(name="child", keep_result=True, max_retries=0)
    async def child(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    @app.task(name="done")
    async def done(n: int) -> None:
        return None

    @app.task(name="next", keep_result=True)
    async def next_step(n: int) -> int:
        return n + 1

    return {"child": child, "done": done, "next": next_step}


async def _drain(app: aqw.App) -> None:
    async with asyncio.timeout(60):
        await app.worker(concurrency=4, burst=True).run()


def _process(spans: list[ReadableSpan], job_id: str) -> ReadableSpan:
    found = [
        s
        for s in spans
        if s.name.startswith("process ")
        and (s.attributes or {}).get("messaging.message.id") == job_id
    ]
    assert len(found) == 1, (job_id, [s.name for s in spans])
    return found[0]


def _batch_links(span: ReadableSpan) -> list[tuple[int, int]]:
    return [
        (link.context.trace_id, link.context.span_id)
        for link in span.links
        if (link.attributes or {}).get("aqw.link") == "batch"
    ]


async def test_callbacks_link_to_their_batch_and_batches_are_counted_once(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(tracer_provider=otel.tp, meter_provider=otel.mp)
    t = _wire(app)
    async with app.batch(on_complete=t["done"], on_success=t["done"], payload=0) as good:
        ok_ids = await good.enqueue_many(t["child"], [1, 2])
    async with app.batch(on_complete=t["done"], on_failure=t["done"], payload=0) as bad:
        await bad.enqueue_many(t["child"], [3, -1])
    plain = await t["child"].enqueue(4)
    await _drain(app)
    spans = otel.spans()
    opened = {
        (s.attributes or {}).get("aqw.batch.id"): s for s in spans if s.name == "aqw.batch.open"
    }
    assert set(opened) == {good.id, bad.id}
    for batch in (good, bad):
        info = await app.batch_info(batch.id)
        assert info is not None and len(info.callbacks) == 2
        span = opened[batch.id]
        for job_id in info.callbacks.values():
            links = _batch_links(_process(spans, job_id))
            assert links == [(span.context.trace_id, span.context.span_id)]
    for job_id in [*ok_ids, plain]:
        assert _batch_links(_process(spans, job_id)) == []

    completed = {
        a.get("aqw.batch.outcome"): p.value for a, p in otel.points("aqw.batches.completed")
    }
    assert completed == {"succeeded": 1, "failed": 1}  # once per batch, not per callback
    durations = otel.points("aqw.batch.duration")
    assert sum(p.count for _, p in durations) == 2
    assert all("aqw.task" not in a for a, _ in durations)


async def test_flow_steps_link_to_the_flow_start_and_to_their_parents(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(tracer_provider=otel.tp, meter_provider=otel.mp)
    t = _wire(app)
    flow = aqw.Flow()
    first = flow.add(t["child"], 1, name="first")
    flow.add(t["next"], after=first, name="second")
    handle = await app.start(flow)
    await _drain(app)
    assert await handle.result(timeout=10) == 2
    spans = otel.spans()
    (start,) = [s for s in spans if s.name == "aqw.flow.start"]
    assert (start.attributes or {}).get("aqw.batch.id") == handle.id
    info = await handle.info()
    assert info is not None
    for step in info.steps.values():
        links = _batch_links(_process(spans, step.job_id))
        assert links == [(start.context.trace_id, start.context.span_id)], step.name
    steps = {
        (s.attributes or {}).get("aqw.flow.step"): s for s in spans if s.name == "aqw.flow.step"
    }
    assert set(steps) == {"first", "second"}
    for name, span in steps.items():
        assert span.parent is not None and span.parent.span_id == start.context.span_id
        run = _process(spans, info.steps[name].job_id)
        assert run.parent is not None and run.parent.span_id == span.context.span_id, name
    second = _process(spans, info.steps["second"].job_id)
    parents = [
        (link.context.trace_id, link.context.span_id)
        for link in second.links
        if (link.attributes or {}).get("aqw.link") == "parent"
    ]
    assert parents == [(steps["first"].context.trace_id, steps["first"].context.span_id)]
    first = _process(spans, info.steps["first"].job_id)
    assert [
        link for link in first.links if (link.attributes or {}).get("aqw.link") == "parent"
    ] == []
    assert otel.points("aqw.batches.completed") == []  # a flow has no callbacks to count


async def test_without_an_sdk_no_batch_header_and_no_span(backend: Backend) -> None:
    app = backend.app()
    t = _wire(app)
    async with app.batch(on_complete=t["done"], payload=0) as batch:
        await batch.enqueue(t["child"], 1)
    await _drain(app)
    info = await app.batch_info(batch.id)
    assert info is not None and info.state == "complete"
    record = await app.job(info.callbacks["complete"])
    assert record is not None and record.state == "succeeded"
    assert all(BATCH_TRACE_HEADER not in job.headers for job in batch._spec.callbacks.values())


async def test_with_trace_link_a_callback_starts_a_trace_linked_to_its_batch(otel: Otel) -> None:
    app = aqw.App("memory://", tracer_provider=otel.tp, trace_link=True)
    t = _wire(app)
    try:
        async with app.batch(on_complete=t["done"], payload=0) as batch:
            await batch.enqueue(t["child"], 1)
        await _drain(app)
    finally:
        await app.close()
    info = await app.batch_info(batch.id)
    assert info is not None
    spans = otel.spans()
    (opened,) = [s for s in spans if s.name == "aqw.batch.open"]
    callback = _process(spans, info.callbacks["complete"])
    assert callback.parent is None  # a new trace: linked, not a child
    assert _batch_links(callback) == [(opened.context.trace_id, opened.context.span_id)]
    assert len(callback.links) == 1  # a callback has no producer span of its own to link
