"""The trace of one job: its ``process`` (CONSUMER) span, with the ``receive``, lease,
handler and settle children and the lease and stuck events."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from ._names import (
    ATTR_ATTEMPT,
    ATTR_FENCING_TOKEN,
    ATTR_LEASE_WAIT,
    ATTR_MESSAGE_ID,
    ATTR_OPERATION_NAME,
    ATTR_OPERATION_TYPE,
    ATTR_OUTCOME,
    ATTR_TASK,
    EVENT_LOST,
    EVENT_RENEWED,
    SPAN_HANDLER,
    SPAN_LEASE,
    SPAN_PROCESS,
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

    def record_error(self, span: Span, error: BaseException, *, status: bool = False) -> None: ...


def now_ns() -> int:
    """Wall-clock nanoseconds, the unit of span timestamps."""
    return time.time_ns()


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


#: The trace of every job while tracing is off, or of a job sampled out.
NO_TRACE = JobTrace()


class RecordingJobTrace(JobTrace):
    """The spans of one job, recorded: the ``process`` span starts when this is made."""

    __slots__ = ("ctx", "span", "tel")

    def __init__(self, tel: Tracing, job: Job, fetched: tuple[int, int] | None) -> None:
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
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attrs,
            links=links,
            start_time=start,
        )
        self.ctx = trace.set_span_in_context(self.span)
        if fetched and self.span.is_recording():
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
