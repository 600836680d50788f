"""OpenTelemetry spans and metrics of the worker, read back from in-memory exporters and
from a real OTLP/HTTP export of an ``aqw worker`` process.

Providers are always passed to ``aqw.App`` explicitly; only the subprocess test configures
the global ones (inside its own process, through ``aqw worker``).
"""

from __future__ import annotations

import asyncio
import gc
import re
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from _otlp_receiver import OtlpReceiver, attributes, iter_points
from conftest import REDIS_BACKENDS, REDIS_URL, Backend, delete_queue_keys
from opentelemetry import baggage, metrics, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import aqw
import aqw.telemetry
from aqw.brokers.memory import MemoryBroker
from tests._helpers import eventually, publish_raw, run_burst, running

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("error")]

#: Retries without jitter: the delay is exactly ``base`` after the first failure.
RETRY = aqw.RetryPolicy(max_retries=3, base=0.05, cap=0.05, jitter=False)

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

#: Every meter provider made here stays referenced for the session. aqw caches its
#: instruments by ``id(meter_provider)`` and never forgets them, so a provider allocated
#: at a collected provider's address would silently get the dead one's instruments
#: (see ``test_a_new_meter_provider_never_inherits_a_collected_ones_instruments``).
_ALIVE: list[Any] = []


# -- providers ---------------------------------------------------------------------------------


def new_meter_provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    """A meter provider with an in-memory reader, at an address aqw has never cached."""
    while True:
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        _ALIVE.append(provider)
        if id(provider) not in aqw.telemetry._instruments.INSTRUMENTS:
            return provider, reader
        provider.shutdown()  # a recycled address (the aqw bug above): take another


class Otel:
    """A tracer provider exporting to memory and a meter provider read from memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tp = TracerProvider()
        self.tp.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.mp, self.reader = new_meter_provider()
        _ALIVE.append(self.tp)

    def providers(self) -> dict[str, Any]:
        return {"tracer_provider": self.tp, "meter_provider": self.mp}

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Metric name -> [(attributes, data point)] from one collection."""
        data = self.reader.get_metrics_data()
        out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "aqw", sm.scope.name
                for metric in sm.metrics:
                    points = out.setdefault(metric.name, [])
                    points.extend((attrs_of(p), p) for p in metric.data.data_points)
        return out

    def shutdown(self) -> None:
        self.tp.shutdown()
        self.mp.shutdown()


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    try:
        yield o
    finally:
        o.shutdown()


def system_of(backend: Backend) -> str:
    return "memory" if backend.kind == "memory" else "redis"


def base_attrs(backend: Backend, queue: str | None = None) -> dict[str, Any]:
    return {
        "messaging.system": system_of(backend),
        "messaging.destination.name": queue or backend.queue,
    }


def per_task(
    points: dict[str, list[tuple[dict[str, Any], Any]]], name: str, base: dict[str, Any]
) -> dict[str | None, Any]:
    """{aqw.task: value (counters) or count (histograms)} of metric ``name``, checking that
    every point carries exactly the queue's attributes plus ``aqw.task``."""
    out: dict[str | None, Any] = {}
    for attrs, point in points.get(name, []):
        task = attrs.get("aqw.task")
        expected = dict(base)
        if task is not None:
            expected["aqw.task"] = task
        assert attrs == expected, (name, attrs)
        assert task not in out, f"{name}: two points for task {task!r}"
        out[task] = point.count if hasattr(point, "count") else point.value
    return out


# -- spans -------------------------------------------------------------------------------------


def attrs_of(item: Any) -> dict[str, Any]:
    """The attributes of a span, an event or a link, as a plain dict."""
    return dict(item.attributes or {})


def times(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None and span.end_time is not None
    return span.start_time, span.end_time


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def child_names(spans: list[ReadableSpan], parent: ReadableSpan) -> list[str]:
    return sorted(s.name for s in children(spans, parent))


def process_spans(spans: list[ReadableSpan], queue: str) -> list[ReadableSpan]:
    """The ``process <queue>`` spans, in start order."""
    found = [s for s in spans if s.name == f"process {queue}"]
    return sorted(found, key=lambda s: s.start_time or 0)


def settle_of(spans: list[ReadableSpan], process: ReadableSpan) -> ReadableSpan:
    settles = [s for s in children(spans, process) if s.name == "aqw.settle"]
    assert len(settles) == 1, child_names(spans, process)
    return settles[0]


def handler_of(spans: list[ReadableSpan], process: ReadableSpan) -> ReadableSpan:
    handlers = [s for s in children(spans, process) if s.name == "aqw.handler"]
    assert len(handlers) == 1, child_names(spans, process)
    return handlers[0]


JOB_CHILDREN = sorted(["aqw.handler", "aqw.lease.acquire", "aqw.settle"])

#: The stage timings on a default ("job" detail) process span, in milliseconds.
STAGE_MS = ("aqw.receive_ms", "aqw.lease.acquire_ms", "aqw.handler_ms", "aqw.settle_ms")

#: The App option of each trace detail (the default is "job").
DETAIL: dict[str, dict[str, Any]] = {"job": {}, "stages": {"trace_detail": "stages"}}


def stage_ms(span: ReadableSpan) -> dict[str, float]:
    """The stage timings on a process span, each checked to be a sane number of ms."""
    attrs = attrs_of(span)
    out = {k: attrs[k] for k in STAGE_MS if k in attrs}
    for k, v in out.items():
        assert isinstance(v, float) and 0.0 <= v < 10_000.0, (k, v)
    return out


def without_stage_ms(span: ReadableSpan) -> dict[str, Any]:
    return {k: v for k, v in attrs_of(span).items() if k not in STAGE_MS}


async def test_one_job_is_one_span_by_default_with_its_stages_as_attributes(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(**otel.providers())
    q = backend.queue
    tracer = trace.get_tracer("tests.handler", tracer_provider=otel.tp)
    seen: dict[str, Any] = {}

    @app.task(name="greet")
    async def greet(name: str, ctx: aqw.Context) -> None:
        seen["fence"] = ctx.fencing_token
        with tracer.start_as_current_span("user.work", attributes={"who": name}):
            await asyncio.sleep(0.02)

    job_id = await greet.enqueue("ada")
    worker = await run_burst(app)
    assert worker.stats.processed == 1

    spans = otel.spans()
    assert sorted(s.name for s in spans) == sorted([f"publish {q}", f"process {q}", "user.work"])
    assert len({s.context.trace_id for s in spans}) == 1, "all spans in one trace"
    publish = one(spans, f"publish {q}")
    process = one(spans, f"process {q}")
    user = one(spans, "user.work")

    assert process.kind is SpanKind.CONSUMER
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert list(process.links) == []
    assert without_stage_ms(process) == {
        **base_attrs(backend),
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": job_id,
        "aqw.task": "greet",
        "aqw.attempt": 1,
        "aqw.fencing_token": seen["fence"],
        "aqw.lease.wait": 0.0,
        "aqw.settle.outcome": "ack",
    }
    stages = stage_ms(process)
    assert set(stages) == set(STAGE_MS)
    assert stages["aqw.handler_ms"] >= 20.0, "the handler slept 20 ms"
    p0, p1 = times(process)
    assert sum(stages.values()) <= (p1 - p0) / 1e6 + 0.01, "the stages fit inside the span"
    assert process.status.status_code is StatusCode.UNSET
    assert list(process.events) == []
    assert children(spans, process) == [user], "no stage spans: the handler's own only"
    # the process span is current while the handler runs
    assert user.parent is not None and user.parent.span_id == process.context.span_id
    assert p0 <= times(user)[0] <= times(user)[1] <= p1


async def test_a_failed_run_is_one_error_span_by_default(backend: Backend, otel: Otel) -> None:
    app = backend.app(retry=RETRY, **otel.providers())
    q = backend.queue

    @app.task(name="flaky")
    async def flaky(ctx: aqw.Context) -> None:
        if ctx.attempt == 1:
            raise ValueError("boom")

    await flaky.enqueue()
    await run_burst(app)
    spans = otel.spans()
    assert len(spans) == 3, [s.name for s in spans]
    first, second = process_spans(spans, q)
    assert attrs_of(first)["aqw.settle.outcome"] == "retry"
    assert attrs_of(first)["aqw.retry.delay"] == 0.05
    assert set(stage_ms(first)) == set(STAGE_MS)
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "ValueError: boom"
    assert [e.name for e in first.events] == ["exception"], "recorded once"
    event = attrs_of(first.events[0])
    assert (event["exception.type"], event["exception.message"]) == ("ValueError", "boom")
    assert attrs_of(second)["aqw.settle.outcome"] == "ack"
    assert second.status.status_code is StatusCode.UNSET
    assert list(second.events) == []


def test_trace_detail_is_checked() -> None:
    with pytest.raises(ValueError, match="trace_detail"):
        aqw.App("memory://q", trace_detail="spans")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="trace detail"):
        aqw.Telemetry("q", "memory", detail="spans")
    assert aqw.App("memory://q").telemetry.detail == "job"
    assert aqw.App("memory://q", trace_detail="stages").telemetry.detail == "stages"


async def test_stages_detail_is_one_trace_from_publish_to_settle(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(trace_detail="stages", **otel.providers())
    q = backend.queue
    tracer = trace.get_tracer("tests.handler", tracer_provider=otel.tp)
    seen: dict[str, Any] = {}

    @app.task(name="greet")
    async def greet(name: str, ctx: aqw.Context) -> None:
        seen["fence"] = ctx.fencing_token
        seen["traceparent"] = ctx.job.headers.get("traceparent")
        with tracer.start_as_current_span("user.work", attributes={"who": name}):
            await asyncio.sleep(0)

    job_id = await greet.enqueue("ada")
    worker = await run_burst(app)
    assert worker.stats.processed == 1

    spans = otel.spans()
    assert sorted(s.name for s in spans) == sorted(
        [f"publish {q}", f"process {q}", f"receive {q}", *JOB_CHILDREN, "user.work"]
    )
    assert len({s.context.trace_id for s in spans}) == 1, "all spans in one trace"
    system = base_attrs(backend)
    publish = one(spans, f"publish {q}")
    process = one(spans, f"process {q}")
    receive = one(spans, f"receive {q}")
    lease = one(spans, "aqw.lease.acquire")
    handler = one(spans, "aqw.handler")
    settle = one(spans, "aqw.settle")
    user = one(spans, "user.work")

    # the producer span, and the trace context it put into the job's headers
    assert publish.kind is SpanKind.PRODUCER
    assert publish.parent is None
    assert attrs_of(publish) == {
        **system,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.message.id": job_id,
        "aqw.task": "greet",
    }
    match = TRACEPARENT.match(seen["traceparent"] or "")
    assert match is not None, seen["traceparent"]
    assert int(match.group(1), 16) == publish.context.trace_id
    assert int(match.group(2), 16) == publish.context.span_id
    assert int(match.group(3), 16) & 0x01, "sampled flag set (other flag bits may vary)"

    # the consumer span: a child of the producer span
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is not None
    assert process.parent.span_id == publish.context.span_id
    assert process.parent.trace_id == publish.context.trace_id
    assert list(process.links) == []
    assert isinstance(seen["fence"], int) and seen["fence"] > 0
    assert attrs_of(process) == {
        **system,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": job_id,
        "aqw.task": "greet",
        "aqw.attempt": 1,
        "aqw.fencing_token": seen["fence"],
        "aqw.settle.outcome": "ack",
    }
    assert process.status.status_code is StatusCode.UNSET
    assert list(process.events) == []
    assert child_names(spans, process) == sorted([f"receive {q}", *JOB_CHILDREN])

    # its children
    assert receive.kind is SpanKind.CONSUMER
    assert attrs_of(receive) == {**system, "messaging.operation.type": "receive"}
    assert receive.start_time == process.start_time
    assert lease.kind is SpanKind.INTERNAL
    assert set(attrs_of(lease)) == {"aqw.lease.wait", "aqw.fencing_token"}
    assert attrs_of(lease)["aqw.fencing_token"] == seen["fence"]
    assert attrs_of(lease)["aqw.lease.wait"] == 0.0  # taken on the first try: waited nothing
    assert lease.status.status_code is StatusCode.UNSET
    assert handler.kind is SpanKind.INTERNAL
    assert handler.status.status_code is StatusCode.UNSET
    assert list(handler.events) == []
    assert attrs_of(settle) == {"aqw.settle.outcome": "ack"}
    assert settle.kind is SpanKind.INTERNAL

    # the handler's own span nests under aqw.handler
    assert user.parent is not None and user.parent.span_id == handler.context.span_id
    assert attrs_of(user) == {"who": "ada"}
    assert children(spans, user) == []

    # in order, each inside the process span
    p0, p1 = times(process)
    for span in (receive, lease, handler, settle, user):
        assert p0 <= times(span)[0] <= times(span)[1] <= p1, span.name
    assert times(receive)[1] <= times(lease)[0]
    assert times(lease)[1] <= times(handler)[0]
    assert times(handler)[0] <= times(user)[0] and times(user)[1] <= times(handler)[1]
    assert times(handler)[1] <= times(settle)[0]


@pytest.mark.parametrize("detail", list(DETAIL))
async def test_a_sampled_out_job_records_nothing_and_its_handler_follows_the_decision(
    backend: Backend, otel: Otel, detail: str
) -> None:
    app = backend.app(**DETAIL[detail], **otel.providers())
    tracer = trace.get_tracer("tests.handler", tracer_provider=otel.tp)
    seen: list[tuple[int, bool]] = []

    @app.task(name="work")
    async def work(n: int) -> None:
        # the SDK's default sampler (ParentBased(ALWAYS_ON)) would record this span if it
        # started a trace of its own
        with tracer.start_as_current_span("user.work") as span:
            seen.append((span.get_span_context().trace_id, span.is_recording()))

    # a caller whose trace is not sampled: the job's traceparent carries the decision
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=trace.TraceFlags(0))
    )
    with trace.use_span(unsampled):
        await work.enqueue_many(range(3))
    worker = await run_burst(app)
    assert worker.stats.processed == 3
    assert otel.spans() == [], "no publish, process or handler span recorded"
    assert seen == [(0xABC, False)] * 3, "the handler's spans stay in the caller's trace"


def test_a_span_the_sampler_drops_is_never_started_and_a_sampled_parent_still_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a sampler whose decision is known without a trace id (``ALWAYS_OFF`` roots under
    ``ParentBased``), a job without trace context, or under an unsampled caller, starts no
    span at all; a job whose headers carry a sampled parent still gets its recorded child
    span. A ratio sampler (decided per trace id) is asked for every job."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=sampling.ParentBased(sampling.ALWAYS_OFF))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tel = aqw.Telemetry("q", "memory", tracer_provider=tp)
    started: list[str] = []
    start_span = tel.tracer.start_span

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        started.append(name)
        return start_span(name, *args, **kwargs)

    monkeypatch.setattr(tel.tracer, "start_span", counting)
    sampled, unsampled = "01", "00"
    parent = f"00-{'ab' * 16}-{'cd' * 8}-"
    plain = aqw.Job(task="t")
    under_unsampled = aqw.Job(task="t", headers={"traceparent": parent + unsampled})
    under_sampled = aqw.Job(task="t", headers={"traceparent": parent + sampled})
    for job in (plain, under_unsampled):
        jt = tel.job(job)
        assert not jt.timed
        with jt.handler():
            assert not trace.get_current_span().is_recording()
        jt.end()
    assert started == [] and exporter.get_finished_spans() == ()
    # nothing current where the worker runs: a dropped root costs what tracing off costs
    assert tel.job(plain) is aqw.telemetry._job_trace.NO_TRACE
    jt = tel.job(under_sampled)
    assert jt.timed
    jt.end()
    assert started == ["process q"]
    [span] = exporter.get_finished_spans()
    assert span.context.trace_flags.sampled
    assert span.parent is not None and span.parent.span_id == int("cd" * 8, 16)
    assert span.context.trace_id == int("ab" * 16, 16)
    tp.shutdown()
    # every other sampler decides each job itself: ALWAYS_OFF drops a sampled parent's child
    # too (never started), a ratio is asked every time
    off = aqw.Telemetry("q", "memory", tracer_provider=TracerProvider(sampler=sampling.ALWAYS_OFF))
    assert not off.job(under_sampled).timed
    ratio = TracerProvider(sampler=sampling.ParentBased(sampling.TraceIdRatioBased(0.0)))
    asked = aqw.Telemetry("q", "memory", tracer_provider=ratio)
    calls: list[str] = []
    ratio_start = asked.tracer.start_span
    monkeypatch.setattr(
        asked.tracer, "start_span", lambda *a, **k: calls.append(a[0]) or ratio_start(*a, **k)
    )
    assert not asked.job(plain).timed
    assert calls == ["process q"]


async def test_a_job_dropped_at_its_root_runs_its_handler_outside_any_span(
    otel: Otel, queue_name: str
) -> None:
    """A job whose root span the sampler drops (none is started) runs its handler with no
    current span, even when the worker was started inside one: the handler's own spans are
    roots, dropped by the same sampler; a job under a sampled producer is recorded as its
    child, with the handler's span under it."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=sampling.ParentBased(sampling.ALWAYS_OFF))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    _ALIVE.append(tp)
    app = aqw.App(MemoryBroker(queue_name), tracer_provider=tp)
    tracer = trace.get_tracer("tests.handler", tracer_provider=tp)
    seen: list[bool] = []

    @app.task(name="work")
    async def work(n: int) -> None:
        with tracer.start_as_current_span("user.work") as span:
            seen.append(span.is_recording())

    await work.enqueue(1)  # no caller's trace: the root is dropped
    caller = TracerProvider()  # a producer whose own sampler records its request span
    caller.add_span_processor(SimpleSpanProcessor(exporter))
    with trace.get_tracer("tests.caller", tracer_provider=caller).start_as_current_span("POST"):
        await work.enqueue(2)
    with trace.get_tracer("tests.boot", tracer_provider=caller).start_as_current_span("boot"):
        worker = app.worker(burst=True)
        await worker.start()
    await asyncio.wait_for(worker.wait_stopped(), 20)
    await worker.stop()
    await app.close()
    assert worker.stats.processed == 2
    assert sorted(seen) == [False, True]
    spans = list(exporter.get_finished_spans())
    names = sorted(s.name for s in spans)
    assert names == ["POST", "boot", f"process {queue_name}", f"publish {queue_name}", "user.work"]
    process = one(spans, f"process {queue_name}")
    assert one(spans, "user.work").parent.span_id == process.context.span_id  # type: ignore[union-attr]
    assert process.parent.span_id == one(spans, f"publish {queue_name}").context.span_id  # type: ignore[union-attr]
    caller.shutdown()
    tp.shutdown()


async def test_baggage_of_the_producer_is_current_in_the_handler(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(**otel.providers())
    seen: list[object] = []

    @app.task(name="work")
    async def work(n: int) -> None:
        seen.append(baggage.get_baggage("tenant"))

    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        await work.enqueue(1)
    finally:
        otel_context.detach(token)
    await run_burst(app)
    assert seen == ["acme"]
    assert one(otel.spans(), f"process {backend.queue}").parent is not None


def test_the_jobs_of_one_batch_read_their_trace_context_once_and_each_job_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tel = aqw.Telemetry("q", "memory", tracer_provider=tp)
    batch = [aqw.Job(task="t") for _ in range(3)]
    single = aqw.Job(task="t")
    with tel.publish(batch):
        pass
    with tel.publish([single]):
        pass
    reads: list[dict[str, str]] = []
    extract = aqw.telemetry._header_contexts.propagate.extract

    def counting(headers: dict[str, str], *args: Any, **kwargs: Any) -> Any:
        reads.append(dict(headers))
        return extract(headers, *args, **kwargs)

    monkeypatch.setattr(aqw.telemetry._header_contexts.propagate, "extract", counting)
    for job in [*batch, single]:
        tel.job(job).end()
    # a caller changing its headers in place after a read: the new ones are read
    single.headers.clear()
    single.headers.update(batch[0].headers)
    tel.job(single).end()
    assert len(reads) == 3, "the batch's headers read once, then each change of them"
    assert reads[0] == reads[2] == batch[0].headers != reads[1]

    publish = {s.context.span_id: s for s in exporter.get_finished_spans() if s.name == "publish q"}
    processes = [s for s in exporter.get_finished_spans() if s.name == "process q"]
    parents = [s.parent.span_id for s in processes if s.parent is not None]
    assert len(parents) == 5 and set(parents) == set(publish)
    assert parents[:3] == [parents[0]] * 3 and parents[3] != parents[0]
    assert parents[4] == parents[0], "the changed headers' producer, not the cached one"
    assert [attrs_of(s)["messaging.message.id"] for s in processes] == [
        *(j.id for j in batch),
        single.id,
        single.id,
    ]
    tp.shutdown()


@pytest.mark.parametrize("detail", list(DETAIL))
async def test_trace_link_starts_a_new_trace_linked_to_the_producer(
    backend: Backend, otel: Otel, detail: str
) -> None:
    app = backend.app(trace_link=True, **DETAIL[detail], **otel.providers())
    q = backend.queue
    tracer = trace.get_tracer("tests.producer", tracer_provider=otel.tp)

    @app.task(name="work")
    async def work() -> None:
        pass

    with tracer.start_as_current_span("POST /signup") as request:
        job_id = await work.enqueue()
    await run_burst(app)

    spans = otel.spans()
    stages = [f"receive {q}", *JOB_CHILDREN] if detail == "stages" else []
    assert sorted(s.name for s in spans) == sorted(
        ["POST /signup", f"publish {q}", f"process {q}", *stages]
    )
    publish = one(spans, f"publish {q}")
    process = one(spans, f"process {q}")
    assert publish.parent is not None
    assert publish.parent.span_id == request.get_span_context().span_id
    assert publish.context.trace_id == request.get_span_context().trace_id

    assert process.parent is None, "a new trace: no parent"
    assert process.context.trace_id != publish.context.trace_id
    assert len(process.links) == 1
    link = process.links[0].context
    assert (link.trace_id, link.span_id) == (publish.context.trace_id, publish.context.span_id)
    assert attrs_of(process)["messaging.message.id"] == job_id
    # the job's own spans live in the new trace, under the process span
    assert child_names(spans, process) == sorted(stages)
    for span in children(spans, process):
        assert span.context.trace_id == process.context.trace_id


async def test_trace_link_is_a_new_trace_even_when_the_worker_starts_inside_a_span(
    otel: Otel, queue_name: str
) -> None:
    app = aqw.App(MemoryBroker(queue_name), trace_link=True, **otel.providers())

    @app.task(name="work")
    async def work() -> None:
        pass

    await work.enqueue()
    tracer = trace.get_tracer("tests.boot", tracer_provider=otel.tp)
    with tracer.start_as_current_span("service startup"):
        worker = app.worker(burst=True)
        await worker.start()
    await asyncio.wait_for(worker.wait_stopped(), 20)
    await worker.stop()
    await app.close()

    process = one(otel.spans(), f"process {queue_name}")
    assert len(process.links) == 1
    assert process.parent is None, "trace_link=True must start a new trace"


async def test_a_retried_job_has_two_process_spans_and_records_the_error(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(retry=RETRY, trace_detail="stages", **otel.providers())
    q = backend.queue
    runs: list[int] = []

    @app.task(name="flaky")
    async def flaky(ctx: aqw.Context) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ValueError("boom")

    job_id = await flaky.enqueue()
    worker = await run_burst(app)
    assert runs == [1, 2]
    assert (worker.stats.processed, worker.stats.retried, worker.stats.failed) == (1, 1, 1)

    spans = otel.spans()
    publish = one(spans, f"publish {q}")
    first, second = process_spans(spans, q)
    assert len(spans) == 1 + 2 * 5
    for process, attempt in ((first, 1), (second, 2)):
        assert process.kind is SpanKind.CONSUMER
        assert process.parent is not None and process.parent.span_id == publish.context.span_id
        assert process.context.trace_id == publish.context.trace_id
        assert attrs_of(process)["aqw.attempt"] == attempt
        assert attrs_of(process)["messaging.message.id"] == job_id
        assert child_names(spans, process) == sorted([f"receive {q}", *JOB_CHILDREN])

    # attempt 1: the handler's error, a retry scheduled with its exact delay
    assert attrs_of(first)["aqw.settle.outcome"] == "retry"
    assert attrs_of(settle_of(spans, first)) == {
        "aqw.settle.outcome": "retry",
        "aqw.retry.delay": 0.05,
    }
    handler = handler_of(spans, first)
    assert handler.status.status_code is StatusCode.ERROR
    assert handler.status.description == "ValueError: boom"
    assert [e.name for e in handler.events] == ["exception"]
    event = attrs_of(handler.events[0])
    assert event["exception.type"] == "ValueError"
    assert event["exception.message"] == "boom"
    assert "Traceback" in str(event["exception.stacktrace"])
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "ValueError: boom"

    # attempt 2: clean
    assert attrs_of(second)["aqw.settle.outcome"] == "ack"
    assert attrs_of(settle_of(spans, second)) == {"aqw.settle.outcome": "ack"}
    assert handler_of(spans, second).status.status_code is StatusCode.UNSET
    assert list(handler_of(spans, second).events) == []
    assert second.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize("detail", list(DETAIL))
async def test_dead_lettered_jobs_carry_the_reason_and_a_malformed_message_crashes_nothing(
    backend: Backend, otel: Otel, detail: str
) -> None:
    app = backend.app(retry=RETRY, **DETAIL[detail], **otel.providers())
    q = backend.queue

    @app.task(name="reject")
    async def reject() -> None:
        raise aqw.Reject("no such mailbox")

    @app.task(name="doomed", max_retries=1)
    async def doomed() -> None:
        raise RuntimeError("downstream is down")

    @app.task(name="fine")
    async def fine() -> None:
        pass

    rejected = await reject.enqueue()
    exhausted = await doomed.enqueue()
    await app.broker.connect()
    await publish_raw(backend, app, b"this is not json")
    ok = await fine.enqueue()
    worker = await run_burst(app)
    assert (worker.stats.processed, worker.stats.dead, worker.stats.malformed) == (1, 3, 1)
    assert (worker.stats.retried, worker.stats.failed) == (1, 3)
    assert len(await app.dlq.list()) == 3

    spans = otel.spans()
    processes = process_spans(spans, q)
    by_job: dict[str, list[ReadableSpan]] = {}
    for p in processes:
        by_job.setdefault(attrs_of(p)["messaging.message.id"], []).append(p)
    assert {k: len(v) for k, v in by_job.items()} == {rejected: 1, exhausted: 2, ok: 1}
    per_job = 5 if detail == "stages" else 1
    assert len(spans) == 3 + 4 * per_job, "no span for the malformed message"

    def settle_attrs(process: ReadableSpan) -> dict[str, Any]:
        if detail == "stages":
            return attrs_of(settle_of(spans, process))
        names = ("aqw.settle.outcome", "aqw.retry.delay", "aqw.dead_letter.reason")
        return {k: v for k, v in attrs_of(process).items() if k in names}

    (r,) = by_job[rejected]
    assert attrs_of(r)["aqw.settle.outcome"] == "dead_letter"
    assert settle_attrs(r) == {
        "aqw.settle.outcome": "dead_letter",
        "aqw.dead_letter.reason": "Reject: no such mailbox",
    }
    assert r.status.status_code is StatusCode.ERROR
    assert r.status.description == "Reject: no such mailbox"
    if detail == "stages":
        assert handler_of(spans, r).status.status_code is StatusCode.ERROR

    d1, d2 = sorted(by_job[exhausted], key=lambda s: attrs_of(s)["aqw.attempt"])
    assert (attrs_of(d1)["aqw.attempt"], attrs_of(d2)["aqw.attempt"]) == (1, 2)
    assert settle_attrs(d1) == {
        "aqw.settle.outcome": "retry",
        "aqw.retry.delay": 0.05,
    }
    assert settle_attrs(d2) == {
        "aqw.settle.outcome": "dead_letter",
        "aqw.dead_letter.reason": "RuntimeError: downstream is down",
    }
    for span in (d1, d2):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "RuntimeError: downstream is down"

    (f,) = by_job[ok]
    assert attrs_of(f)["aqw.settle.outcome"] == "ack"
    assert f.status.status_code is StatusCode.UNSET

    # and the counters agree, the malformed message counted without a task
    m = otel.metrics()
    base = base_attrs(backend)
    assert per_task(m, "aqw.jobs.dead_lettered", base) == {"reject": 1, "doomed": 1, None: 1}
    assert per_task(m, "aqw.jobs.failed", base) == {"reject": 1, "doomed": 2}
    assert per_task(m, "aqw.jobs.retried", base) == {"doomed": 1}
    assert per_task(m, "aqw.jobs.processed", base) == {"fine": 1}


# -- leases ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", REDIS_BACKENDS, indirect=True)
async def test_a_lost_lease_is_an_event_and_an_error_and_the_job_is_not_acked(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(lease_ttl=0.3, **otel.providers())
    q = backend.queue
    assert backend.raw is not None
    started = asyncio.Event()
    cancelled = asyncio.Event()
    go_on = asyncio.Event()
    runs: list[int] = []

    @app.task(name="slow")
    async def slow(ctx: aqw.Context) -> None:
        runs.append(ctx.fencing_token)
        if len(runs) == 1:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        else:
            await go_on.wait()

    job_id = await slow.enqueue()
    worker = app.worker(heartbeat=0.1)
    async with running(worker):
        await asyncio.wait_for(started.wait(), 10)
        assert await backend.raw.delete(f"aqw:{{{q}}}:lease:{job_id}") == 1
        await asyncio.wait_for(cancelled.wait(), 2)
        await eventually(lambda: worker.stats.lease_lost == 1, 2, "the loss to be counted")
        depth = await app.broker.depth()
        assert (depth.waiting, depth.in_flight, depth.dead) == (0, 1, 0), "not acked"
        assert worker.stats.processed == 0
        # the abandoned delivery is reclaimed and runs again, under a new lease
        await eventually(lambda: len(runs) == 2, 10, "the redelivery")
        go_on.set()
        await eventually(lambda: worker.stats.processed == 1, 10, "the second run's ack")
    assert runs[1] > runs[0], "a higher fencing token on the second run"
    assert worker.stats.lease_lost == 1

    spans = otel.spans()
    first, second = process_spans(spans, q)
    assert attrs_of(first)["messaging.message.id"] == attrs_of(second)["messaging.message.id"]
    lost = [e for e in first.events if e.name == "aqw.lease.lost"]
    assert len(lost) == 1
    assert attrs_of(lost[0]) == {
        "aqw.lease.reason": "renewal refused: the key was deleted or taken by another holder"
    }
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description is not None
    assert first.status.description.startswith("LeaseLost: lease ")
    assert "aqw.settle.outcome" not in attrs_of(first)
    assert "aqw.settle" not in child_names(spans, first), "nothing settled under a lost lease"
    assert [e.name for e in first.events if e.name != "aqw.lease.renewed"] == [
        "aqw.lease.lost",
        "exception",
    ]
    assert attrs_of(second)["aqw.settle.outcome"] == "ack"
    assert second.status.status_code is StatusCode.UNSET
    assert [e.name for e in second.events if e.name == "aqw.lease.lost"] == []
    assert attrs_of(second)["aqw.fencing_token"] == runs[1]

    base = base_attrs(backend)
    assert per_task(otel.metrics(), "aqw.lease.lost", base) == {"slow": 1}


async def test_renewals_of_a_long_job_are_events_and_counted(backend: Backend, otel: Otel) -> None:
    # a lease long enough that a loaded machine's stalled loop (0.1-0.3 s) never loses it
    app = backend.app(lease_ttl=1.2, **otel.providers())
    q = backend.queue
    renewals: list[int] = []

    @app.task(name="long")
    async def long(ctx: aqw.Context) -> None:
        await asyncio.sleep(1.3)
        assert ctx.lease is not None
        renewals.append(ctx.lease.renewals)

    await long.enqueue()
    await run_burst(app)

    (process,) = process_spans(otel.spans(), q)
    events = [e for e in process.events if e.name == "aqw.lease.renewed"]
    assert [e.name for e in process.events] == ["aqw.lease.renewed"] * len(events)
    n = len(events)
    # renewed at least every ttl/3 = 0.4 s over 1.3 s: 3 or more (a renewal already in
    # flight when the handler returns may still land, before the settle)
    assert n >= 3, n
    assert n in (renewals[0], renewals[0] + 1), (n, renewals)
    assert [attrs_of(e) for e in events] == [{"aqw.lease.renewals": i} for i in range(1, n + 1)]
    assert per_task(otel.metrics(), "aqw.lease.renewals", base_attrs(backend)) == {"long": n}
    assert attrs_of(process)["aqw.settle.outcome"] == "ack"


@pytest.mark.parametrize("backend", REDIS_BACKENDS, indirect=True)
@pytest.mark.parametrize("detail", list(DETAIL))
async def test_a_lease_held_elsewhere_is_an_error_span_and_nothing_runs(
    backend: Backend, otel: Otel, detail: str
) -> None:
    app = backend.app(lease_ttl=0.3, **DETAIL[detail], **otel.providers())
    q = backend.queue
    assert backend.raw is not None
    runs: list[str] = []

    @app.task(name="work")
    async def work(ctx: aqw.Context) -> None:
        runs.append(ctx.job.id)

    job_id = await work.enqueue()
    key = f"aqw:{{{q}}}:lease:{job_id}"
    assert await backend.raw.set(key, "another-holder", px=20_000)
    worker = app.worker()
    async with running(worker):
        await eventually(lambda: worker.stats.lease_busy == 1, 10, "the refused lease")
        assert runs == []
        await backend.raw.delete(key)
        await eventually(lambda: worker.stats.processed == 1, 10, "the run after the holder left")
    assert runs == [job_id]

    spans = otel.spans()
    refused, ran = process_spans(spans, q)
    if detail == "stages":
        assert child_names(spans, refused) == sorted([f"receive {q}", "aqw.lease.acquire"])
        lease = one(children(spans, refused), "aqw.lease.acquire")
        assert lease.status.status_code is StatusCode.ERROR
        assert lease.status.description == "lease held by another holder"
        assert child_names(spans, ran) == JOB_CHILDREN, "a reclaimed delivery: no receive span"
    else:
        assert len(spans) == 3, [s.name for s in spans]
        assert [e.name for e in refused.events] == ["aqw.lease.refused"]
        assert set(stage_ms(refused)) == {"aqw.receive_ms", "aqw.lease.acquire_ms"}
        assert "aqw.receive_ms" not in stage_ms(ran), "a reclaimed delivery: no receive time"
        assert "aqw.lease.acquire_ms" in stage_ms(ran)
    assert "aqw.fencing_token" not in attrs_of(refused)
    assert "aqw.settle.outcome" not in attrs_of(refused)
    assert attrs_of(ran)["aqw.settle.outcome"] == "ack"
    assert per_task(otel.metrics(), "aqw.jobs.processed", base_attrs(backend)) == {"work": 1}


@pytest.mark.parametrize("detail", list(DETAIL))
async def test_a_job_cancelled_by_shutdown_is_settled_as_requeue(
    backend: Backend, otel: Otel, detail: str
) -> None:
    app = backend.app(**DETAIL[detail], **otel.providers())
    q = backend.queue
    started = asyncio.Event()

    @app.task(name="endless")
    async def endless() -> None:
        started.set()
        await asyncio.sleep(30)

    job_id = await endless.enqueue()
    worker = app.worker()
    await worker.start()
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.wait_for(worker.stop(grace=0.1), 20)
    assert (worker.stats.requeued, worker.stats.processed) == (1, 0), "handed back"

    spans = otel.spans()
    (process,) = process_spans(spans, q)
    assert attrs_of(process)["messaging.message.id"] == job_id
    assert attrs_of(process)["aqw.settle.outcome"] == "requeue"
    if detail == "stages":
        assert attrs_of(settle_of(spans, process)) == {"aqw.settle.outcome": "requeue"}
    else:
        # the handler ran until the 0.1 s grace cancelled it, then the requeue settled it
        assert set(stage_ms(process)) == set(STAGE_MS)
        assert stage_ms(process)["aqw.handler_ms"] >= 100.0
    assert process.status.status_code is StatusCode.UNSET, "a shutdown is not a job error"
    m = otel.metrics()
    for name in ("aqw.jobs.processed", "aqw.jobs.failed", "aqw.jobs.retried"):
        assert name not in m, name
    assert per_task(m, "aqw.job.wait", base_attrs(backend)) == {"endless": 1}


# -- metrics -----------------------------------------------------------------------------------


async def test_job_counters_and_histograms_are_exact(backend: Backend, otel: Otel) -> None:
    app = backend.app(retry=RETRY, **otel.providers())

    @app.task(name="ok")
    async def ok(n: int) -> None:
        pass

    @app.task(name="flaky")
    async def flaky(n: int, ctx: aqw.Context) -> None:
        if ctx.attempt == 1:
            raise ValueError("first run fails")

    @app.task(name="bad")
    async def bad(n: int) -> None:
        raise aqw.Reject("never")

    @app.task(name="doomed", max_retries=2)
    async def doomed(n: int) -> None:
        raise RuntimeError("always")

    N, M, K = 4, 3, 2
    await ok.enqueue_many(range(N))
    await flaky.enqueue_many(range(M))
    await bad.enqueue_many(range(K))
    await doomed.enqueue(0)
    assert otel.metrics().get("aqw.jobs.processed", []) == [], "nothing counted before a run"
    worker = await run_burst(app)

    m = otel.metrics()
    base = base_attrs(backend)
    assert per_task(m, "aqw.jobs.processed", base) == {"ok": N, "flaky": M}
    assert per_task(m, "aqw.jobs.failed", base) == {"flaky": M, "bad": K, "doomed": 3}
    assert per_task(m, "aqw.jobs.retried", base) == {"flaky": M, "doomed": 2}
    assert per_task(m, "aqw.jobs.dead_lettered", base) == {"bad": K, "doomed": 1}
    runs = {"ok": N, "flaky": 2 * M, "bad": K, "doomed": 3}
    assert per_task(m, "aqw.job.duration", base) == runs
    assert per_task(m, "aqw.job.wait", base) == runs
    for name in ("aqw.job.duration", "aqw.job.wait"):
        for _, point in m[name]:
            assert point.sum >= 0 and point.min >= 0
    for name in ("aqw.jobs.stuck", "aqw.lease.lost", "aqw.jobs.duplicates_skipped"):
        assert name not in m, name
    stats = worker.stats
    assert (stats.processed, stats.failed, stats.retried, stats.dead) == (
        N + M,
        M + K + 3,
        M + 2,
        K + 1,
    )

    # counters are cumulative totals: a second collection reads the same numbers
    again = otel.metrics()
    assert per_task(again, "aqw.jobs.processed", base) == {"ok": N, "flaky": M}
    assert per_task(again, "aqw.job.duration", base) == runs


def test_histogram_values_are_kept_and_recorded_in_a_batch_at_collection() -> None:
    mp, reader = new_meter_provider()
    tel = aqw.Telemetry("q", "memory", meter_provider=mp)
    instruments = aqw.telemetry._instruments.INSTRUMENTS[mp]
    for i in range(5):
        tel.observe("aqw.job.duration", i / 10, "t")
    tel.observe("aqw.job.wait", 2.0, "t")
    assert len(instruments.pending[("aqw.job.duration", "q", "t")][0]) == 5, "kept, not recorded"
    data = reader.get_metrics_data()
    assert instruments.pending == {}, "a collection flushes what was kept"
    assert data is not None
    points = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (duration,) = points["aqw.job.duration"]
    assert (duration.count, round(duration.sum, 9), duration.max) == (5, 1.0, 0.4)
    assert dict(duration.attributes) == {
        "messaging.system": "memory",
        "messaging.destination.name": "q",
        "aqw.task": "t",
    }
    assert [p.count for p in points["aqw.job.wait"]] == [1]
    tel.flush()  # nothing kept: a no-op
    mp.shutdown()


def test_a_batch_recorded_inside_a_span_takes_no_exemplar_from_it() -> None:
    # The SDK's default exemplar filter samples an exemplar from the span of the context a
    # value is recorded in; a batch recorded while some job's span is current must not
    # pin its values on that span.
    mp, reader = new_meter_provider()
    tp = TracerProvider()
    tel = aqw.Telemetry("q", "memory", meter_provider=mp)
    for i in range(3):
        tel.observe("aqw.job.duration", i / 10, "t")
    with tp.get_tracer("tests").start_as_current_span("someone else's job"):
        assert trace.get_current_span().get_span_context().trace_flags.sampled
        tel.flush()
    data = reader.get_metrics_data()
    assert data is not None
    (point,) = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "aqw.job.duration"
        for p in m.data.data_points
    ]
    assert point.count == 3
    assert list(point.exemplars) == []
    mp.shutdown()
    tp.shutdown()


def test_a_full_batch_is_recorded_at_once_and_every_value_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aqw.telemetry._instruments, "MAX_PENDING", 4)
    mp, reader = new_meter_provider()
    tel = aqw.Telemetry("q", "memory", meter_provider=mp)
    instruments = aqw.telemetry._instruments.INSTRUMENTS[mp]
    recorded: list[int] = []
    record = instruments._record
    monkeypatch.setattr(
        instruments,
        "_record",
        lambda p: (record(p), recorded.append(sum(len(v) for v, _ in p.values()))),
    )
    values = [float(i) for i in range(11)]
    for value in values:
        tel.observe("aqw.job.duration", value, "t")
    assert recorded == [4, 4], "each full batch went to the SDK by the caller, at once"
    assert len(instruments.pending[("aqw.job.duration", "q", "t")][0]) == 3
    data = reader.get_metrics_data()
    assert data is not None
    (metric,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "aqw.job.duration"
    ]
    (point,) = metric.data.data_points
    assert (point.count, point.sum, point.min, point.max) == (11, sum(values), 0.0, 10.0)
    assert recorded == [4, 4, 3], "none lost, none twice"
    mp.shutdown()


async def test_a_stopping_worker_hands_every_kept_value_to_the_sdk(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(**otel.providers())

    @app.task(name="work")
    async def work(n: int) -> None:
        pass

    n = 7
    await work.enqueue_many(range(n))
    instruments = aqw.telemetry._instruments.INSTRUMENTS[otel.mp]
    recorded: Counter[str] = Counter()
    record = instruments._record

    def counting(pending: Any) -> None:
        for (name, _, _), (values, _) in pending.items():
            recorded[name] += len(values)
        record(pending)

    instruments._record = counting  # type: ignore[method-assign]
    worker = await run_burst(app)
    assert worker.stats.processed == n
    # before any collection: the stop itself recorded them
    assert instruments.pending == {}
    assert recorded == {"aqw.job.duration": n, "aqw.job.wait": n}
    m = otel.metrics()
    base = base_attrs(backend)
    assert per_task(m, "aqw.job.duration", base) == {"work": n}
    assert per_task(m, "aqw.job.wait", base) == {"work": n}
    assert recorded == {"aqw.job.duration": n, "aqw.job.wait": n}, "recorded once"


async def test_two_apps_on_one_meter_provider_count_their_own_queues(
    otel: Otel, queue_names: Callable[[], str]
) -> None:
    qa, qb = queue_names(), queue_names()
    apps = [aqw.App(MemoryBroker(q), **otel.providers()) for q in (qa, qb)]
    for app, n in zip(apps, (2, 3), strict=True):

        @app.task(name="work")
        async def work(i: int) -> None:
            pass

        await work.enqueue_many(range(n))
        await run_burst(app)
        await app.close()
    points = otel.metrics()["aqw.jobs.processed"]
    got = {attrs["messaging.destination.name"]: p.value for attrs, p in points}
    assert got == {qa: 2, qb: 3}


def lock_app(
    backend: Backend, otel: Otel, **options: Any
) -> tuple[aqw.App, aqw.Task[None], list[str]]:
    """A task taking ``ctx.lock("x")``: "first" holds it 0.3 s; "second" asks for it only
    once "first" holds it, so it waits; "alone" takes it without contention."""
    app = backend.app(**options, **otel.providers())
    held = asyncio.Event()
    order: list[str] = []
    LOCK_MARKS.clear()

    @app.task(name="locker")
    async def locker(who: str, ctx: aqw.Context) -> None:
        if who == "second":
            await held.wait()
            LOCK_MARKS["asked"] = time.monotonic()
        async with ctx.lock("x", wait=5.0):
            order.append(who)
            if who == "first":
                held.set()
                await asyncio.sleep(0.3)
                LOCK_MARKS["releasing"] = time.monotonic()

    return app, locker, order


#: ``asked``: when "second" asked for the lock; ``releasing``: when "first" was about to let
#: go of it. The second's wait is at least the time between them, however loaded the machine.
LOCK_MARKS: dict[str, float] = {}


@pytest.mark.parametrize("detail", list(DETAIL))
async def test_lock_contention_is_timed_and_traced(
    backend: Backend, otel: Otel, detail: str
) -> None:
    app, locker, order = lock_app(backend, otel, **DETAIL[detail])
    q = backend.queue
    await locker.enqueue_many(["first", "second"])
    await run_burst(app, concurrency=2)
    assert order == ["first", "second"]

    m = otel.metrics()
    base = base_attrs(backend)
    contended = per_task(m, "aqw.lock.contended", base)
    assert contended == {None: 1}
    ((attrs, wait),) = m["aqw.lock.wait"]
    assert attrs == base
    waited_at_least = LOCK_MARKS["releasing"] - LOCK_MARKS["asked"] - 0.001
    assert waited_at_least > 0 and wait.max >= waited_at_least, "it waited for the first to let go"

    spans = otel.spans()
    locks = [s for s in spans if s.name == "aqw.lock x"]
    assert len(locks) == 2
    by_id = {s.context.span_id: s for s in spans}
    for lock in locks:
        assert attrs_of(lock) == {**base, "aqw.lock.name": "x"}
        assert lock.kind is SpanKind.INTERNAL
        assert lock.status.status_code is StatusCode.UNSET
        assert lock.parent is not None
        parent = by_id[lock.parent.span_id]
        if detail == "stages":
            assert parent.name == "aqw.handler"
            assert parent.parent is not None
            process = by_id[parent.parent.span_id]
        else:
            process = parent
        assert process.name == f"process {q}"
        assert lock.context.trace_id == process.context.trace_id
    durations = sorted(times(s)[1] - times(s)[0] for s in locks)
    assert durations[1] >= waited_at_least * 1e9, "the contended acquisition's span covers its wait"


async def test_lock_contended_counts_only_acquisitions_that_waited(
    backend: Backend, otel: Otel
) -> None:
    app, locker, order = lock_app(backend, otel)
    base = base_attrs(backend)
    await locker.enqueue("alone")
    await run_burst(app)
    assert order == ["alone"]
    m = otel.metrics()
    assert per_task(m, "aqw.lock.contended", base) == {}, "no contention yet"
    assert "aqw.lock.wait" not in m
    await locker.enqueue_many(["first", "second"])
    await run_burst(app, concurrency=2)
    assert order == ["alone", "first", "second"]
    m = otel.metrics()
    assert per_task(m, "aqw.lock.contended", base) == {None: 1}
    assert per_task(m, "aqw.lock.wait", base) == {None: 1}


async def test_gauges_report_in_flight_jobs_and_queue_depth(backend: Backend, otel: Otel) -> None:
    app = backend.app(**otel.providers())
    release = asyncio.Event()
    started: list[int] = []

    @app.task(name="block")
    async def block(n: int) -> None:
        started.append(n)
        await release.wait()

    base = base_attrs(backend)

    def gauge(name: str) -> list[tuple[dict[str, Any], float]]:
        return [(attrs, p.value) for attrs, p in otel.metrics().get(name, [])]

    await block.enqueue_many(range(3))
    worker = app.worker(concurrency=1, heartbeat=0.1)
    async with running(worker):
        await eventually(lambda: started == [0], 10, "the first job to start")
        worker_attrs = {**base, "aqw.worker": worker.name}
        assert gauge("aqw.worker.in_flight") == [(worker_attrs, 1)]
        expected = {
            "aqw.queue.depth": 2,
            "aqw.queue.in_flight": 1,
            "aqw.queue.delayed": 0,
            "aqw.queue.dlq": 0,
        }

        def depth_is(values: dict[str, int]) -> bool:
            return all(gauge(name) == [(base, v)] for name, v in values.items())

        await eventually(lambda: depth_is(expected), 10, f"depth gauges {expected}")
        release.set()
        await eventually(lambda: worker.stats.processed == 3, 10, "three jobs done")
        await eventually(
            lambda: gauge("aqw.worker.in_flight") == [(worker_attrs, 0)], 5, "in_flight 0"
        )
        done = dict.fromkeys(expected, 0)
        await eventually(lambda: depth_is(done), 10, "empty queue depth gauges")
    # a stopped worker reports nothing
    m = otel.metrics()
    for name in ("aqw.worker.in_flight", *expected):
        assert name not in m, name


async def test_a_job_past_twice_its_sla_is_reported_stuck_once(
    backend: Backend, otel: Otel
) -> None:
    app = backend.app(**otel.providers())
    q = backend.queue

    @app.task(name="sluggish", sla=0.1)
    async def sluggish() -> None:
        await asyncio.sleep(0.5)

    @app.task(name="quick", sla=0.1)
    async def quick() -> None:
        pass

    await sluggish.enqueue()
    await quick.enqueue()
    worker = await run_burst(app, heartbeat=0.1)
    assert worker.stats.stuck == 1

    assert per_task(otel.metrics(), "aqw.jobs.stuck", base_attrs(backend)) == {"sluggish": 1}
    spans = otel.spans()
    by_task = {attrs_of(p)["aqw.task"]: p for p in process_spans(spans, q)}
    assert set(by_task) == {"sluggish", "quick"}
    stuck = [e for e in by_task["sluggish"].events if e.name == "aqw.job.stuck"]
    assert [attrs_of(e) for e in stuck] == [{"aqw.sla": 0.1}]
    assert list(by_task["quick"].events) == []
    assert attrs_of(by_task["sluggish"])["aqw.settle.outcome"] == "ack"


async def test_a_new_meter_provider_never_inherits_a_collected_ones_instruments() -> None:
    cache = getattr(aqw.telemetry._instruments, "INSTRUMENTS", {})
    cached = dict(cache)
    try:
        await _make_and_drop_meter_providers(60, cache, len(cached))
    finally:  # leave no stale entries behind for later tests
        cache.clear()
        cache.update(cached)


async def _make_and_drop_meter_providers(count: int, cache: Any, cached: int) -> None:
    for i in range(count):
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        tel = aqw.Telemetry(f"q{i}", "memory", meter_provider=provider)
        tel.count("aqw.jobs.processed", "work")
        data = reader.get_metrics_data()
        names = (
            [m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
            if data is not None
            else []
        )
        assert "aqw.jobs.processed" in names, f"provider #{i} recorded nothing"
        provider.shutdown()
        del provider, reader, tel
        if i % 20 == 19:
            gc.collect()
    # no recycled address came up this time: the leak is still there to see
    gc.collect()
    assert len(cache) <= cached + 1, f"instruments of {len(cache) - cached} dead providers kept"


# -- telemetry off -----------------------------------------------------------------------------


async def test_with_the_default_proxy_providers_telemetry_is_off_and_jobs_run(
    backend: Backend,
) -> None:
    assert type(trace.get_tracer_provider()).__name__.startswith("Proxy")
    assert type(metrics.get_meter_provider()).__name__.startswith("_Proxy")
    app = backend.app(retry=RETRY)
    assert app.telemetry.tracing is False
    assert app.telemetry.metering is False
    headers: list[dict[str, str]] = []

    @app.task(name="work")
    async def work(n: int, ctx: aqw.Context) -> None:
        headers.append(dict(ctx.job.headers))
        if n == 1 and ctx.attempt == 1:
            raise ValueError("once")

    await work.enqueue_many([0, 1])
    worker = await run_burst(app)
    assert (worker.stats.processed, worker.stats.retried) == (2, 1)
    assert all("traceparent" not in h for h in headers), "no trace context without tracing"
    assert worker.tel is app.telemetry
    assert aqw.telemetry.Telemetry("q", "memory").job(aqw.Job(task="t")) is (
        aqw.telemetry._job_trace.NO_TRACE
    )


# -- OTLP/HTTP export from an `aqw worker` process ----------------------------------------------


WORKER_MODULE = """
import aqw

app = aqw.App("memory://", queue="unused")


@app.task(name="work")
async def work(n: int) -> None:
    if n < 0:
        raise aqw.Reject("negative")
"""


@pytest.mark.redis
@pytest.mark.timeout(45)
async def test_aqw_worker_exports_spans_and_metrics_over_otlp_http(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    q = queue_name
    module = f"otel_app_{q.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(WORKER_MODULE))
    with OtlpReceiver() as rx:
        # the producer side: its own provider, exporting to the same receiver
        tp = TracerProvider()
        tp.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{rx.endpoint}/v1/traces"))
        )
        producer = aqw.App(REDIS_URL, queue=q, tracer_provider=tp)

        @producer.task(name="work")
        async def work(n: int) -> None:
            pass

        try:
            ids = [await work.enqueue(1), await work.enqueue(2), await work.enqueue(-1)]
        finally:
            await producer.close()
            tp.shutdown()
        rx.wait_for(lambda: rx.span_names().count(f"publish {q}") == 3, 10, "3 publish spans")

        env = dict(subprocess_env)
        for name in list(env):
            if name.startswith("OTEL_"):
                del env[name]
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=rx.endpoint,
            OTEL_METRIC_EXPORT_INTERVAL="200",
            OTEL_BSP_SCHEDULE_DELAY="100",
            OTEL_SERVICE_NAME=f"aqw-test-{q}",
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aqw",
            "worker",
            f"{module}:app",
            "--burst",
            "--broker",
            REDIS_URL,
            "--queue",
            q,
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        text = err.decode(errors="replace")
        assert proc.returncode == 0, text
        assert "stopped after" in text and ": 2 succeeded, 1 dead-lettered" in text, text
        # shutdown_otel flushed on exit: everything has arrived by now
        assert rx.errors == []

        publish = {
            attributes(s.attributes)["messaging.message.id"]: s
            for _, s in rx.spans()
            if s.name == f"publish {q}"
        }
        processes = [(res, s) for res, s in rx.spans() if s.name == f"process {q}"]
        assert len(processes) == 3
        for resource, span in processes:
            assert resource["service.name"] == f"aqw-test-{q}"
            attrs = attributes(span.attributes)
            assert attrs["messaging.system"] == "redis"
            assert attrs["messaging.destination.name"] == q
            job_id = attrs["messaging.message.id"]
            assert job_id in ids
            parent = publish[job_id]
            assert span.trace_id == parent.trace_id, "the worker continued the producer's trace"
            assert span.parent_span_id == parent.span_id
            assert span.kind == 5  # SPAN_KIND_CONSUMER
        outcomes = Counter(attributes(s.attributes)["aqw.settle.outcome"] for _, s in processes)
        assert outcomes == Counter({"ack": 2, "dead_letter": 1})
        from_worker = Counter(
            s.name for res, s in rx.spans() if res.get("service.name") == f"aqw-test-{q}"
        )
        assert from_worker == Counter({f"process {q}": 3}), "one span a job by default"
        for _, span in processes:
            assert set(STAGE_MS) <= set(attributes(span.attributes))

        processed = rx.metrics_named("aqw.jobs.processed")
        assert processed, f"no aqw.jobs.processed among {len(rx.metrics)} metric exports"
        final: dict[str, int] = {}
        for resource, metric in processed:
            assert resource["service.name"] == f"aqw-test-{q}"
            assert metric.WhichOneof("data") == "sum"
            assert metric.sum.is_monotonic
            for point in iter_points(metric):
                attrs = attributes(point.attributes)
                assert attrs["messaging.destination.name"] == q
                final[attrs["aqw.task"]] = point.as_int
        assert final == {"work": 2}, "the last export holds the cumulative total"
        _, dead = rx.metrics_named("aqw.jobs.dead_lettered")[-1]
        assert [(attributes(p.attributes)["aqw.task"], p.as_int) for p in iter_points(dead)] == [
            ("work", 1)
        ]
        durations = rx.metrics_named("aqw.job.duration")
        assert durations
        last = list(iter_points(durations[-1][1]))
        assert [p.count for p in last] == [3]
    # the worker's queue left nothing behind but its counters; the keys go
    client = sync_redis.Redis.from_url(REDIS_URL)
    try:
        assert client.xlen(f"aqw:{{{q}}}:stream") == 0
    finally:
        client.close()
    delete_queue_keys([q])
