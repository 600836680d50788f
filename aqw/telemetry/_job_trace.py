"""The trace of one job: its ``process`` (CONSUMER) span, with the lease and stuck events.

By default (``trace_detail="job"``) that span is all: the stages are timing attributes on
it (``aqw.receive_ms``, ``aqw.lease.acquire_ms``, ``aqw.handler_ms``, ``aqw.settle_ms``)
and it is current while the handler runs. With ``trace_detail="stages"`` it also has the
``receive``, ``aqw.lease.acquire``, ``aqw.handler`` and ``aqw.settle`` children (four more
spans per job, each costing about as much as the ``process`` span itself)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import Token
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from ._header_contexts import ROOT
from ._names import (
    ATTR_ATTEMPT,
    ATTR_FENCING_TOKEN,
    ATTR_HANDLER_MS,
    ATTR_LEASE_ACQUIRE_MS,
    ATTR_LEASE_WAIT,
    ATTR_MESSAGE_ID,
    ATTR_OPERATION_NAME,
    ATTR_OPERATION_TYPE,
    ATTR_OUTCOME,
    ATTR_RECEIVE_MS,
    ATTR_SETTLE_MS,
    ATTR_TASK,
    EVENT_LOST,
    EVENT_REFUSED,
    EVENT_RENEWED,
    SPAN_HANDLER,
    SPAN_LEASE,
    SPAN_RECEIVE,
    SPAN_SETTLE,
)

if TYPE_CHECKING:
    from ..job import Job
    from ..lease import Lease


class Tracing(Protocol):
    """What a job's trace needs of its ``Telemetry``."""

    @property
    def queue(self) -> str: ...

    @property
    def link(self) -> bool: ...

    @property
    def tracer(self) -> trace.Tracer: ...

    @property
    def attributes(self) -> dict[str, Any]: ...

    @property
    def detail(self) -> str: ...

    def record_error(self, span: Span, error: BaseException, *, status: bool = False) -> None: ...


def now_ns() -> int:
    """Wall-clock nanoseconds, the unit of span timestamps."""
    return time.time_ns()


#: What the handler of an untraced job runs in (a ``nullcontext`` is reusable).
_NO_SPAN: AbstractContextManager[Any] = nullcontext()


class JobTrace:
    """The spans of one job. This base class does nothing (tracing off)."""

    __slots__ = ()

    #: whether the job's stages are timed (a recorded span): the lease's start is stamped
    timed: ClassVar[bool] = False

    def lease_acquired(self, lease: Lease, started_ns: int) -> None:
        """The job's lease was taken (span from ``started_ns`` to now)."""

    def lease_refused(self, started_ns: int) -> None:
        """The job's lease is held by another holder."""

    def handler(self) -> AbstractContextManager[Any]:
        """A span current while the handler runs."""
        return _NO_SPAN

    def settled(self, outcome: str, attributes: dict[str, Any] | None = None) -> None:
        """The settle step's outcome: ack, skip, retry, dead_letter, requeue."""

    def event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """An event on the process span."""

    def end(self, error: BaseException | None = None) -> None:
        """Close the process span (ERROR status when ``error`` is given)."""


#: The trace of every job while tracing is off.
NO_TRACE = JobTrace()

#: The root context: a ``process`` span's parent when the job carries no trace context.
#: (None would mean "the current span", whatever was active when the worker started.)
_ROOT = ROOT

#: What is current while the handler of a job whose root span the sampler drops runs (no
#: span was started for it): no span, so the handler's own spans are roots, dropped by the
#: same sampler, whatever was current when the worker started. Nothing is propagated from
#: it (as with tracing off).
UNSAMPLED_ROOT = trace.set_span_in_context(trace.INVALID_SPAN, _ROOT)


def process_attributes(tel: Tracing, task: str) -> dict[str, Any]:
    """The attributes every ``process`` span of ``task`` starts with (built once per task by
    ``Telemetry`` and shared: the SDK copies what it keeps). The message id and the attempt
    are set when the span ends, with the stage timings, so that a job sampled out builds no
    attribute dict at all."""
    attrs = dict(tel.attributes)
    attrs[ATTR_OPERATION_TYPE] = "process"
    attrs[ATTR_OPERATION_NAME] = "process"
    attrs[ATTR_TASK] = task
    return attrs


def job_attributes(job: Job) -> dict[str, Any]:
    """The attributes of a recorded ``process`` span that vary from job to job."""
    return {ATTR_MESSAGE_ID: job.id, ATTR_ATTEMPT: job.attempt}


def start_process_span(
    tel: Tracing,
    extracted: Context,
    fetched: tuple[int, int] | None,
    name: str,
    attributes: dict[str, Any],
    extra: list[Link] | None = None,
) -> Span:
    """Start a job's ``process`` span named ``name``, with the task's constant
    ``attributes``: a child of the producer's span in ``extracted`` (the context the job's
    headers carry), or (``tel.link``) the root of a new trace linked to it; ``extra``: links
    besides (a batch callback's or a flow step's, to its batch's or flow's span)."""
    parent = extracted
    links = extra
    if tel.link:
        producer = trace.get_current_span(extracted).get_span_context()
        if producer.is_valid:
            links = [Link(producer), *(extra or ())]
        parent = _ROOT
    return tel.tracer.start_span(
        name,
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        start_time=fetched[0] if fetched else None,
    )


class SampledOutJobTrace(JobTrace):
    """A job whose ``process`` span is not recorded (sampled out): no attributes, events or
    children, only its context, current while the handler runs, so that the handler's own
    spans are sampled out with it instead of starting traces of their own."""

    __slots__ = ("ctx", "token")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.token: Token[Context] | None = None

    def handler(self) -> AbstractContextManager[Any]:
        return self

    def __enter__(self) -> None:
        self.token = otel_context.attach(self.ctx)

    def __exit__(self, *exc_info: object) -> None:
        if self.token is not None:
            otel_context.detach(self.token)
            self.token = None


class RecordingJobTrace(JobTrace):
    """One recorded job as one span (``trace_detail="job"``): the stages' times are kept
    here as nanosecond stamps and set on the span, with the job's own attributes, in one
    call when it ends."""

    __slots__ = (
        "began",
        "ctx",
        "extra",
        "fence",
        "fetched",
        "handler_end",
        "job",
        "lease_end",
        "lease_start",
        "lease_wait",
        "outcome",
        "settle_end",
        "span",
        "tel",
        "token",
    )

    timed = True

    def __init__(
        self,
        tel: Tracing,
        span: Span,
        extracted: Context,
        fetched: tuple[int, int] | None,
        job: Job,
    ) -> None:
        self.tel = tel
        self.span = span
        self.ctx = extracted
        self.fetched = fetched
        self.job = job
        self.fence: int | None = None  # the lease's fencing token, once it is taken
        self.lease_wait = 0.0
        self.lease_start = self.lease_end = self.began = self.handler_end = self.settle_end = 0
        self.outcome: str | None = None
        self.extra: dict[str, Any] | None = None
        self.token: Token[Context] | None = None

    def lease_acquired(self, lease: Lease, started_ns: int) -> None:
        self.lease_start = started_ns
        self.lease_end = now_ns()
        self.fence, self.lease_wait = lease.fencing_token, lease.waited
        lease.on_renewed(self._renewed)
        lease.on_lost(self._lost)

    def _renewed(self, lease: Lease) -> None:
        self.span.add_event(EVENT_RENEWED, {"aqw.lease.renewals": lease.renewals})

    def _lost(self, lease: Lease) -> None:
        self.span.add_event(EVENT_LOST, {"aqw.lease.reason": lease.lost_reason or ""})

    def lease_refused(self, started_ns: int) -> None:
        self.lease_start = started_ns
        self.lease_end = now_ns()
        self.span.add_event(EVENT_REFUSED)

    def handler(self) -> AbstractContextManager[Any]:
        # the process span is current, so the handler's own spans nest under it; an error
        # is recorded once, on the process span, by end()
        return self

    def __enter__(self) -> None:
        self.token = otel_context.attach(trace.set_span_in_context(self.span, self.ctx))
        self.began = now_ns()

    def __exit__(self, *exc_info: object) -> None:
        self.handler_end = now_ns()
        if self.token is not None:
            otel_context.detach(self.token)
            self.token = None

    def settled(self, outcome: str, attributes: dict[str, Any] | None = None) -> None:
        self.outcome = outcome
        if self.handler_end:
            self.settle_end = now_ns()
        if attributes:
            if self.extra is None:
                self.extra = {}
            self.extra.update(attributes)

    def event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        self.span.add_event(name, attributes or {})

    def end(self, error: BaseException | None = None) -> None:
        attrs = job_attributes(self.job)
        if self.fence is not None:
            attrs[ATTR_FENCING_TOKEN] = self.fence
            attrs[ATTR_LEASE_WAIT] = self.lease_wait
        if self.fetched:
            attrs[ATTR_RECEIVE_MS] = (self.fetched[1] - self.fetched[0]) / 1e6
        if self.lease_end:
            attrs[ATTR_LEASE_ACQUIRE_MS] = (self.lease_end - self.lease_start) / 1e6
        if self.handler_end:
            attrs[ATTR_HANDLER_MS] = (self.handler_end - self.began) / 1e6
        if self.settle_end:
            attrs[ATTR_SETTLE_MS] = (self.settle_end - self.handler_end) / 1e6
        if self.outcome is not None:
            attrs[ATTR_OUTCOME] = self.outcome
        if self.extra:
            attrs.update(self.extra)
        self.span.set_attributes(attrs)
        if error is not None:
            self.tel.record_error(self.span, error, status=True)
        self.span.end()


class StagesJobTrace(JobTrace):
    """One recorded job with a child span per stage (``trace_detail="stages"``): ``receive``,
    ``aqw.lease.acquire``, ``aqw.handler`` and ``aqw.settle``."""

    __slots__ = ("ctx", "span", "tel")

    timed = True

    def __init__(
        self,
        tel: Tracing,
        span: Span,
        extracted: Context,
        fetched: tuple[int, int] | None,
        job: Job,
    ) -> None:
        self.tel = tel
        self.span = span
        span.set_attributes(job_attributes(job))
        self.ctx = trace.set_span_in_context(span, extracted)
        if fetched:
            receive = tel.tracer.start_span(
                SPAN_RECEIVE.format(queue=tel.queue),
                context=self.ctx,
                kind=SpanKind.CONSUMER,
                attributes={**tel.attributes, ATTR_OPERATION_TYPE: "receive"},
                start_time=fetched[0],
            )
            receive.end(end_time=fetched[1])

    def lease_acquired(self, lease: Lease, started_ns: int) -> None:
        self.span.set_attribute(ATTR_FENCING_TOKEN, lease.fencing_token)
        child = self.tel.tracer.start_span(
            SPAN_LEASE,
            context=self.ctx,
            start_time=started_ns,
            attributes={ATTR_LEASE_WAIT: lease.waited, ATTR_FENCING_TOKEN: lease.fencing_token},
        )
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
