"""OpenTelemetry spans and metrics: every name in one place.

The library uses ``opentelemetry-api`` only. With no SDK configured (the API's proxy
providers), tracing and metrics are switched off at the source: no span objects are made and
no instruments touched, so the overhead is a couple of attribute checks per job.

Spans (OpenTelemetry messaging semantic conventions):

- ``publish <queue>`` (PRODUCER) around enqueue; injects ``traceparent``/``tracestate`` into
  the job headers.
- ``process <queue>`` (CONSUMER) per job; continues the producer's trace (``link=False``,
  the default: a child) or starts a new trace linked to it (``link=True``). Children:
  ``receive <queue>`` (the fetch that delivered it), ``aqw.lease.acquire``, ``aqw.handler``
  (current while the handler runs, so its own spans nest under it) and ``aqw.settle``.
  Events: ``aqw.lease.renewed``, ``aqw.lease.lost``, ``aqw.job.stuck``.
- ``aqw.lock <name>`` around ``ctx.lock(...)`` acquisitions.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from ._redact import redact_error, redact_message, redact_traceback
from ._version import __version__

if TYPE_CHECKING:
    from .brokers.base import QueueDepth
    from .job import Job
    from .lease import Lease

SCOPE = "aqw"

# -- span names and attributes -------------------------------------------------------------
SPAN_PUBLISH = "publish {queue}"
SPAN_PROCESS = "process {queue}"
SPAN_RECEIVE = "receive {queue}"
SPAN_LEASE = "aqw.lease.acquire"
SPAN_HANDLER = "aqw.handler"
SPAN_SETTLE = "aqw.settle"
SPAN_LOCK = "aqw.lock {name}"
EVENT_RENEWED = "aqw.lease.renewed"
EVENT_LOST = "aqw.lease.lost"
EVENT_STUCK = "aqw.job.stuck"

ATTR_SYSTEM = "messaging.system"
ATTR_DESTINATION = "messaging.destination.name"
ATTR_OPERATION_TYPE = "messaging.operation.type"
ATTR_OPERATION_NAME = "messaging.operation.name"
ATTR_MESSAGE_ID = "messaging.message.id"
ATTR_BATCH_COUNT = "messaging.batch.message_count"
ATTR_CONSUMER_GROUP = "messaging.consumer.group.name"
ATTR_TASK = "aqw.task"
ATTR_ATTEMPT = "aqw.attempt"
ATTR_FENCING_TOKEN = "aqw.fencing_token"
ATTR_OUTCOME = "aqw.settle.outcome"
ATTR_RETRY_DELAY = "aqw.retry.delay"
ATTR_DLQ_REASON = "aqw.dead_letter.reason"
ATTR_LEASE_WAIT = "aqw.lease.wait"
ATTR_LOCK = "aqw.lock.name"

# -- metric names (OTel; a Prometheus exporter renders dots as underscores and adds unit
#    suffixes and `_total` on counters: aqw_jobs_processed_total, aqw_job_duration_seconds) --
METRICS: dict[str, tuple[str, str, str]] = {
    # name: (instrument, unit, description)
    "aqw.job.duration": ("histogram", "s", "Handler run time"),
    "aqw.job.wait": ("histogram", "s", "Time from enqueue to the start of a run"),
    "aqw.jobs.processed": ("counter", "{job}", "Jobs finished and acknowledged"),
    "aqw.jobs.failed": ("counter", "{job}", "Handler runs that raised or timed out"),
    "aqw.jobs.retried": ("counter", "{job}", "Failed runs scheduled to run again"),
    "aqw.jobs.dead_lettered": ("counter", "{job}", "Jobs moved to the dead-letter queue"),
    "aqw.jobs.duplicates_skipped": ("counter", "{job}", "Redelivered finished jobs skipped"),
    "aqw.jobs.stuck": ("counter", "{job}", "Jobs seen running past 2x their SLA"),
    "aqw.lease.renewals": ("counter", "{renewal}", "Successful lease renewals"),
    "aqw.lease.lost": ("counter", "{lease}", "Leases lost while held"),
    "aqw.lock.contended": ("counter", "{acquisition}", "Lock acquisitions refused or waited"),
    "aqw.lock.wait": ("histogram", "s", "Time spent waiting for a lock"),
    "aqw.cache.hits": ("counter", "{lookup}", "Cache lookups answered from the cache"),
    "aqw.cache.misses": ("counter", "{lookup}", "Cache lookups that missed"),
    "aqw.queue.depth": ("gauge", "{job}", "Jobs waiting to be fetched"),
    "aqw.queue.in_flight": ("gauge", "{job}", "Jobs delivered and not yet settled (queue-wide)"),
    "aqw.queue.delayed": ("gauge", "{job}", "Jobs scheduled for later"),
    "aqw.queue.dlq": ("gauge", "{job}", "Jobs in the dead-letter queue"),
    "aqw.worker.in_flight": ("gauge", "{job}", "Jobs running in this worker"),
}


def _sdk_configured(provider: object) -> bool:
    name = type(provider).__name__
    return not (name.startswith(("Proxy", "_Proxy", "NoOp", "_NoOp")))


class _Instruments:
    """The meter's instruments, made once per meter provider.

    Counters are observable counters over totals kept here: counting a job is a dict
    update, and the SDK reads the totals when it collects, instead of aggregating every
    increment as it happens (several microseconds each, per job)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.meter = meter
        self.totals: dict[tuple[str, str, str], list[Any]] = {}
        self.histograms: dict[str, metrics.Histogram] = {}
        self.gauge_sources: list[Callable[[], list[tuple[str, float, dict[str, Any]]]]] = []
        for name, (kind, unit, description) in METRICS.items():
            if kind == "counter":
                meter.create_observable_counter(
                    name, [self._totals(name)], unit=unit, description=description
                )
            elif kind == "histogram":
                self.histograms[name] = meter.create_histogram(name, unit, description)
            else:
                meter.create_observable_gauge(
                    name, [self._observer(name)], unit=unit, description=description
                )

    def _totals(self, name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            for (metric, _, _), (value, attributes) in list(self.totals.items()):
                if metric == name:
                    yield Observation(value, attributes)

        return observe

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            for source in list(self.gauge_sources):
                for metric, value, attributes in source():
                    if metric == name:
                        yield Observation(value, attributes)

        return observe


#: Instruments per meter provider, forgotten with the provider (an ``id()`` could be reused).
_INSTRUMENTS: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()


class Telemetry:
    """Tracing and metrics for one queue. Off (and nearly free) when no SDK is configured.

    Args:
        queue: the queue name (``messaging.destination.name``).
        system: ``messaging.system`` (``redis``, ``aws_sqs``, ``memory``).
        tracer_provider: an explicit tracer provider (default: the global one).
        meter_provider: an explicit meter provider (default: the global one).
        link: start each job's ``process`` span in a new trace linked to the producer's,
            instead of as its child.
        redact: record errors on spans without payload contents: ``exception.message``,
            ``exception.stacktrace`` and the ERROR status carry ``aqw._redact`` text (a
            ``ValidationError`` as locations and messages, no input values). False: the
            raw ``str(error)`` and traceback, as the OpenTelemetry SDK records them.
    """

    def __init__(
        self,
        queue: str,
        system: str,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        link: bool = False,
        redact: bool = True,
    ) -> None:
        tp = tracer_provider or trace.get_tracer_provider()
        mp = meter_provider or metrics.get_meter_provider()
        self.queue = queue
        self.link = link
        self.redact = redact
        self.tracing = _sdk_configured(tp)
        self.metering = _sdk_configured(mp)
        self.tracer = tp.get_tracer(SCOPE, __version__)
        self.attributes: dict[str, Any] = {ATTR_SYSTEM: system, ATTR_DESTINATION: queue}
        self._instruments: _Instruments | None = None
        if self.metering:
            if mp not in _INSTRUMENTS:
                _INSTRUMENTS[mp] = _Instruments(mp.get_meter(SCOPE, __version__))
            self._instruments = _INSTRUMENTS[mp]
        self._metric_attrs: dict[str, dict[str, Any]] = {}

    # -- metrics ---------------------------------------------------------------------------

    def _attrs(self, task: str | None) -> dict[str, Any]:
        key = task or ""
        attrs = self._metric_attrs.get(key)
        if attrs is None:
            attrs = {ATTR_SYSTEM: self.attributes[ATTR_SYSTEM], ATTR_DESTINATION: self.queue}
            if task:
                attrs[ATTR_TASK] = task
            self._metric_attrs[key] = attrs
        return attrs

    def count(self, name: str, task: str | None = None, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (one of ``METRICS``)."""
        if self._instruments is not None:
            key = (name, self.queue, task or "")
            total = self._instruments.totals.get(key)
            if total is None:
                self._instruments.totals[key] = [n, self._attrs(task)]
            else:
                total[0] += n

    def observe(self, name: str, value: float, task: str | None = None) -> None:
        """Record ``value`` in histogram ``name``."""
        if self._instruments is not None:
            self._instruments.histograms[name].record(value, self._attrs(task))

    def add_gauges(self, source: Callable[[], list[tuple[str, float, dict[str, Any]]]]) -> None:
        """Register a source of gauge readings: (metric name, value, attributes) tuples."""
        if self._instruments is not None:
            self._instruments.gauge_sources.append(source)

    def remove_gauges(self, source: Callable[[], list[tuple[str, float, dict[str, Any]]]]) -> None:
        if self._instruments is not None and source in self._instruments.gauge_sources:
            self._instruments.gauge_sources.remove(source)

    def depth_readings(self, depth: QueueDepth) -> list[tuple[str, float, dict[str, Any]]]:
        """Gauge readings of a queue depth snapshot."""
        attrs = self._attrs(None)
        return [
            ("aqw.queue.depth", depth.waiting, attrs),
            ("aqw.queue.in_flight", depth.in_flight, attrs),
            ("aqw.queue.delayed", depth.delayed, attrs),
            ("aqw.queue.dlq", depth.dead, attrs),
        ]

    def cache_hook(self) -> Callable[[str, str], None]:
        """An ``on_event`` hook for ``aqw.Cache`` that counts hits and misses."""

        def on_event(event: str, key: str) -> None:
            if event == "hit":
                self.count("aqw.cache.hits")
            elif event == "miss":
                self.count("aqw.cache.misses")

        return on_event

    # -- spans -----------------------------------------------------------------------------

    def record_error(self, span: Span, error: BaseException, *, status: bool = False) -> None:
        """Add ``error`` to ``span`` as an ``exception`` event (and, with ``status``, set
        the span's ERROR status), its message and stacktrace redacted unless ``redact`` is
        off. Use this instead of ``span.record_exception``, which records ``str(error)``."""
        if not span.is_recording():
            return
        if self.redact:
            span.record_exception(
                error,
                attributes={
                    "exception.message": redact_message(error),
                    "exception.stacktrace": redact_traceback(error),
                },
            )
            description = redact_error(error)
        else:
            span.record_exception(error)
            description = f"{type(error).__name__}: {error}"
        if status:
            span.set_status(Status(StatusCode.ERROR, description))

    @contextmanager
    def publish(self, jobs: Sequence[Job]) -> Iterator[None]:
        """The producer span around an enqueue; fills each job's trace headers."""
        if not self.tracing:
            yield
            return
        attrs = dict(self.attributes)
        attrs[ATTR_OPERATION_TYPE] = "send"
        attrs[ATTR_OPERATION_NAME] = "publish"
        if len(jobs) == 1:
            attrs[ATTR_MESSAGE_ID] = jobs[0].id
            attrs[ATTR_TASK] = jobs[0].task
        else:
            attrs[ATTR_BATCH_COUNT] = len(jobs)
        name = SPAN_PUBLISH.format(queue=self.queue)
        with self.tracer.start_as_current_span(
            name, kind=SpanKind.PRODUCER, attributes=attrs, record_exception=False,
            set_status_on_exception=False,
        ) as span:  # fmt: skip
            for job in jobs:
                propagate.inject(job.headers)
            try:
                yield
            except Exception as exc:
                self.record_error(span, exc, status=True)
                raise

    def job(self, job: Job, fetched: tuple[int, int] | None = None) -> JobTrace:
        """The trace of one job's processing (a no-op when tracing is off)."""
        if not self.tracing:
            return _NO_TRACE
        jt = _JobTrace(self, job, fetched)
        if not jt.span.is_recording():  # sampled out: no children, no events
            jt.span.end()
            return _NO_TRACE
        return jt

    def lock(self, name: str) -> AbstractContextManager[Any]:
        """A span around a lock acquisition."""
        if not self.tracing:
            return nullcontext()
        attrs = dict(self.attributes)
        attrs[ATTR_LOCK] = name
        return self.tracer.start_as_current_span(SPAN_LOCK.format(name=name), attributes=attrs)


class JobTrace:
    """The spans of one job. This base class does nothing (tracing off)."""

    __slots__ = ()

    def lease_acquired(self, lease: Lease, started_ns: int) -> None:
        """The job's lease was taken (span from ``started_ns`` to now)."""

    def lease_refused(self, started_ns: int) -> None:
        """The job's lease is held by another holder."""

    def handler(self) -> AbstractContextManager[Any]:
        """A span current while the handler runs."""
        return nullcontext()

    def settled(self, outcome: str, attributes: dict[str, Any] | None = None) -> None:
        """The settle step's outcome: ack, skip, retry, dead_letter, requeue."""

    def event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """An event on the process span."""

    def end(self, error: BaseException | None = None) -> None:
        """Close the process span (ERROR status when ``error`` is given)."""


_NO_TRACE = JobTrace()


class _JobTrace(JobTrace):
    __slots__ = ("ctx", "span", "tel")

    def __init__(self, tel: Telemetry, job: Job, fetched: tuple[int, int] | None) -> None:
        self.tel = tel
        attrs = dict(tel.attributes)
        attrs[ATTR_OPERATION_TYPE] = "process"
        attrs[ATTR_OPERATION_NAME] = "process"
        attrs[ATTR_MESSAGE_ID] = job.id
        attrs[ATTR_TASK] = job.task
        attrs[ATTR_ATTEMPT] = job.attempt
        # An empty context, not None: None would mean "the current span", which is whatever
        # was active when the worker started.
        parent = propagate.extract(job.headers) if job.headers else Context()
        links: list[Link] = []
        if tel.link and parent is not None:
            producer = trace.get_current_span(parent).get_span_context()
            if producer.is_valid:
                links.append(Link(producer))
            parent = Context()
        name = SPAN_PROCESS.format(queue=tel.queue)
        start = fetched[0] if fetched else None
        self.span = tel.tracer.start_span(
            name, context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=links,
            start_time=start,
        )  # fmt: skip
        self.ctx = trace.set_span_in_context(self.span)
        if fetched and self.span.is_recording():
            receive = tel.tracer.start_span(
                SPAN_RECEIVE.format(queue=tel.queue), context=self.ctx, kind=SpanKind.CONSUMER,
                attributes={**tel.attributes, ATTR_OPERATION_TYPE: "receive"},
                start_time=fetched[0],
            )  # fmt: skip
            receive.end(end_time=fetched[1])

    def lease_acquired(self, lease: Lease, started_ns: int) -> None:
        self.span.set_attribute(ATTR_FENCING_TOKEN, lease.fencing_token)
        child = self.tel.tracer.start_span(
            SPAN_LEASE, context=self.ctx, start_time=started_ns,
            attributes={ATTR_LEASE_WAIT: lease.waited, ATTR_FENCING_TOKEN: lease.fencing_token},
        )  # fmt: skip
        child.end()
        lease.on_renewed(self._renewed)
        lease.on_lost(self._lost)

    def _renewed(self, lease: Lease) -> None:
        self.span.add_event(EVENT_RENEWED, {"aqw.lease.renewals": lease.renewals})

    def _lost(self, lease: Lease) -> None:
        self.span.add_event(EVENT_LOST, {"aqw.lease.reason": lease.lost_reason or ""})

    def lease_refused(self, started_ns: int) -> None:
        child = self.tel.tracer.start_span(SPAN_LEASE, context=self.ctx, start_time=started_ns)
        child.set_status(Status(StatusCode.ERROR, "lease held by another holder"))
        child.end()

    @contextmanager
    def handler(self) -> Iterator[Any]:
        # The SDK's own recording would put str(exc) on the span: record_error redacts it.
        with self.tel.tracer.start_as_current_span(
            SPAN_HANDLER, context=self.ctx, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield span
            except Exception as exc:
                self.tel.record_error(span, exc, status=True)
                raise

    def settled(self, outcome: str, attributes: dict[str, Any] | None = None) -> None:
        attrs: dict[str, Any] = {ATTR_OUTCOME: outcome}
        if attributes:
            attrs.update(attributes)
        self.span.set_attribute(ATTR_OUTCOME, outcome)
        child = self.tel.tracer.start_span(SPAN_SETTLE, context=self.ctx, attributes=attrs)
        child.end()

    def event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        self.span.add_event(name, attributes or {})

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.tel.record_error(self.span, error, status=True)
        self.span.end()


def now_ns() -> int:
    """Wall-clock nanoseconds, the unit of span timestamps."""
    return time.time_ns()


def configure_otel(service_name: str = "aqw-worker") -> bool:
    """Configure the OpenTelemetry SDK from the standard ``OTEL_*`` environment variables
    (OTLP/HTTP exporter) when the ``otel`` extra is installed and an
    ``OTEL_EXPORTER_OTLP[_TRACES|_METRICS]_ENDPOINT`` is set; returns False otherwise.
    Used by ``aqw worker`` and ``aqw monitor``; libraries embedding aqw configure their own."""
    import os

    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return False
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    endpoints = ("", "_TRACES", "_METRICS")
    if not any(os.environ.get(f"OTEL_EXPORTER_OTLP{e}_ENDPOINT") for e in endpoints):
        return False  # nowhere to export to: stay off rather than retry a default port
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    return True


def shutdown_otel() -> None:
    """Flush and shut down SDK providers configured by ``configure_otel``."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()
