"""``Telemetry``: the tracing and metrics of one queue -- counters, histograms, gauges, the
publish and lock spans, and redacted error recording."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .._redact import redact_error, redact_message, redact_traceback
from .._version import __version__
from ._batch_trace import batch_links
from ._header_contexts import HeaderContexts
from ._instruments import INSTRUMENTS, GaugeSource, Instruments
from ._job_trace import (
    NO_TRACE,
    UNSAMPLED_ROOT,
    JobTrace,
    RecordingJobTrace,
    SampledOutJobTrace,
    StagesJobTrace,
    process_attributes,
    start_process_span,
)
from ._names import (
    ATTR_BATCH_COUNT,
    ATTR_DESTINATION,
    ATTR_LOCK,
    ATTR_MESSAGE_ID,
    ATTR_OPERATION_NAME,
    ATTR_OPERATION_TYPE,
    ATTR_SYSTEM,
    ATTR_TASK,
    SCOPE,
    SPAN_LOCK,
    SPAN_PROCESS,
    SPAN_PUBLISH,
    TRACE_DETAILS,
)
from ._otel import sdk_configured
from ._sampling import known_drops

if TYPE_CHECKING:
    from ..brokers.base import QueueDepth
    from ..job import Job

#: What ``Telemetry.publish`` returns when tracing is off (a ``nullcontext`` is reusable).
_NO_SPAN: AbstractContextManager[None] = nullcontext()


class Telemetry:
    """Tracing and metrics for one queue. Off (and nearly free) when no SDK is configured.

    Args:
        queue: the queue name (``messaging.destination.name``).
        system: ``messaging.system`` (``redis``, ``aws_sqs``, ``memory``).
        tracer_provider: an explicit tracer provider (default: the global one).
        meter_provider: an explicit meter provider (default: the global one).
        link: start each job's ``process`` span in a new trace linked to the producer's,
            instead of as its child.
        detail: ``job`` (the default): one ``process`` span per job, its stages recorded as
            attributes on it; ``stages``: with a child span per stage as well (``receive``,
            ``aqw.lease.acquire``, ``aqw.handler``, ``aqw.settle``).
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
        detail: str = "job",
    ) -> None:
        if detail not in TRACE_DETAILS:
            raise ValueError(f"trace detail must be one of {TRACE_DETAILS}, not {detail!r}")
        tp = tracer_provider or trace.get_tracer_provider()
        mp = meter_provider or metrics.get_meter_provider()
        self.queue = queue
        self.link = link
        self.redact = redact
        self.detail = detail
        self.tracing = sdk_configured(tp)
        self.metering = sdk_configured(mp)
        self.tracer = tp.get_tracer(SCOPE, __version__)
        #: what the tracer's sampler drops whatever the trace id (``_sampling.py``): such a
        #: job starts no span
        self._drops = known_drops(self.tracer) if self.tracing else None
        self.attributes: dict[str, Any] = {ATTR_SYSTEM: system, ATTR_DESTINATION: queue}
        self._instruments: Instruments | None = None
        if self.metering:
            if mp not in INSTRUMENTS:
                INSTRUMENTS[mp] = Instruments(mp.get_meter(SCOPE, __version__))
            self._instruments = INSTRUMENTS[mp]
        self._metric_attrs: dict[str, dict[str, Any]] = {}
        self._process_name = SPAN_PROCESS.format(queue=queue)
        self._process_attrs: dict[str, dict[str, Any]] = {}
        self._header_contexts = HeaderContexts()
        self._lease_counters: dict[str, tuple[Callable[[Any], None], Callable[[Any], None]]] = {}

    # -- metrics ---------------------------------------------------------------------------

    def metric_attributes(self, task: str | None) -> dict[str, Any]:
        """The attributes of this queue's metric points (with ``aqw.task`` when ``task`` is
        given), made once per task and shared: copy before changing them."""
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
                self._instruments.totals[key] = [n, self.metric_attributes(task)]
            else:
                total[0] += n

    def count_reason(
        self, name: str, task: str | None, reason: str, attribute: str = "reason"
    ) -> None:
        """Add 1 to counter ``name`` (one of ``METRICS``) with a ``reason`` attribute (or
        the one named ``attribute``)."""
        if self._instruments is not None:
            key = (name, self.queue, f"{task or ''}\0{reason}")
            total = self._instruments.totals.get(key)
            if total is None:
                attrs = {**self.metric_attributes(task), attribute: reason}
                self._instruments.totals[key] = [1, attrs]
            else:
                total[0] += 1

    def lease_counters(self, task: str) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
        """Callbacks for ``Lease.on_renewed`` and ``Lease.on_lost`` that count ``task``'s
        lease renewals and losses (made once per task)."""
        counters = self._lease_counters.get(task)
        if counters is None:
            counters = self._lease_counters[task] = (
                lambda _: self.count("aqw.lease.renewals", task),
                lambda _: self.count("aqw.lease.lost", task),
            )
        return counters

    def observe(self, name: str, value: float, task: str | None = None) -> None:
        """Record ``value`` in histogram ``name``: kept here, and handed to the SDK in a batch
        when it collects (see ``Instruments``)."""
        if self._instruments is not None:
            key = (name, self.queue, task or "")
            self._instruments.observe(key, value, self.metric_attributes(task))

    def flush(self) -> None:
        """Hand the histogram values kept so far to the SDK now (it does so itself whenever
        it collects)."""
        if self._instruments is not None:
            self._instruments.flush()

    def add_gauges(self, source: GaugeSource) -> None:
        """Register a source of gauge readings: (metric name, value, attributes) tuples."""
        if self._instruments is not None:
            self._instruments.gauge_sources.append(source)

    def remove_gauges(self, source: GaugeSource) -> None:
        if self._instruments is not None and source in self._instruments.gauge_sources:
            self._instruments.gauge_sources.remove(source)

    def depth_readings(self, depth: QueueDepth) -> list[tuple[str, float, dict[str, Any]]]:
        """Gauge readings of a queue depth snapshot."""
        attrs = self.metric_attributes(None)
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

    def publish(self, jobs: Sequence[Job]) -> AbstractContextManager[None]:
        """The producer span around an enqueue; fills each job's trace headers (nothing
        to do, and nothing made per call, when tracing is off)."""
        if not self.tracing:
            return _NO_SPAN
        return self._publish(jobs)

    @contextmanager
    def _publish(self, jobs: Sequence[Job]) -> Iterator[None]:
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
            name,
            kind=SpanKind.PRODUCER,
            attributes=attrs,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            for job in jobs:
                propagate.inject(job.headers)
            try:
                yield
            except Exception as exc:
                self.record_error(span, exc, status=True)
                raise

    def job(self, job: Job, fetched: tuple[int, int] | None = None) -> JobTrace:
        """The trace of one job's processing (a no-op when tracing is off). ``fetched``: the
        wall-clock nanoseconds the fetch that delivered it started and ended."""
        if not self.tracing:
            return NO_TRACE
        drops = self._drops
        if drops is not None:  # a span the sampler drops is not started at all
            headers = job.headers
            if self.link or not headers:
                if drops.roots:  # its handler's spans are roots too, dropped alike
                    return self._dropped_root()
            else:
                parent = self._header_contexts.of(headers)
                producer = trace.get_current_span(parent).get_span_context()
                if not producer.is_valid:
                    if drops.roots:
                        return self._dropped_root()
                elif drops.sampled if producer.trace_flags.sampled else drops.unsampled:
                    # the handler's spans are the producer's children, dropped alike
                    return SampledOutJobTrace(parent)
        attrs = self._process_attrs.get(job.task)
        if attrs is None:
            attrs = self._process_attrs[job.task] = process_attributes(self, job.task)
        extracted = self._header_contexts.of(job.headers)
        links = batch_links(job.headers)
        span = start_process_span(self, extracted, fetched, self._process_name, attrs, links)
        if not span.is_recording():  # sampled out: no attributes, events or children
            return SampledOutJobTrace(trace.set_span_in_context(span, extracted))
        if self.detail == "job":
            return RecordingJobTrace(self, span, extracted, fetched, job)
        return StagesJobTrace(self, span, extracted, fetched, job)

    @staticmethod
    def _dropped_root() -> JobTrace:
        """The trace of a job whose root span the sampler drops: nothing to do when nothing
        is current (the worker's usual context: no span, no baggage), else the handler runs
        with no span current."""
        if not otel_context.get_current():
            return NO_TRACE
        return SampledOutJobTrace(UNSAMPLED_ROOT)

    def lock(self, name: str) -> AbstractContextManager[Any]:
        """A span around a lock acquisition."""
        if not self.tracing:
            return nullcontext()
        attrs = dict(self.attributes)
        attrs[ATTR_LOCK] = name
        return self.tracer.start_as_current_span(SPAN_LOCK.format(name=name), attributes=attrs)
