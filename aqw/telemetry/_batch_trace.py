"""Batches and flows seen in telemetry: the span that opens a batch (``aqw.batch.open``) or
starts a flow (``aqw.flow.start``), its context kept in ``BATCH_TRACE_HEADER`` of the jobs it
leads to (a batch's callbacks, a flow's steps), so that their ``process`` spans link to it;
and the batch metrics, recorded once per batch by its first callback when it runs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, TraceFlags

from ..brokers.batching import BATCH_INFO_HEADER, CALLBACK_KINDS, BatchInfo
from ._names import (
    ATTR_BATCH_ID,
    ATTR_BATCH_OUTCOME,
    ATTR_FLOW_STEP,
    ATTR_LINK_KIND,
    SPAN_FLOW_STEP,
)

if TYPE_CHECKING:
    from ..job import Job


class Telemetry(Protocol):
    """What these need of ``Telemetry`` (seen through a Protocol: it imports this module)."""

    @property
    def tracing(self) -> bool: ...
    @property
    def tracer(self) -> trace.Tracer: ...
    @property
    def attributes(self) -> dict[str, Any]: ...
    def count_reason(
        self, name: str, task: str | None, reason: str, attribute: str = "reason"
    ) -> None: ...
    def observe(self, name: str, value: float, task: str | None = None) -> None: ...


#: A batch callback's or a flow step's header: the trace context (``traceparent`` form) of
#: the span that opened its batch or started its flow, then (a flow step) its parents'
#: ``aqw.flow.step`` spans', space-separated.
BATCH_TRACE_HEADER = "aqw-batch-trace"

_NOTHING: AbstractContextManager[str | None] = nullcontext(None)


def traceparent(context: SpanContext) -> str:
    """A span context in the W3C ``traceparent`` form."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(text: str) -> SpanContext | None:
    """The span context of a ``traceparent``, None when it is not one."""
    parts = text.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return context if context.is_valid else None


def opening(tel: Telemetry, name: str, batch_id: str) -> AbstractContextManager[str | None]:
    """A span ``name`` (``aqw.batch.open``, ``aqw.flow.start``), current inside the block,
    which gives its ``traceparent``; None and no span when tracing is off or it is not
    sampled."""
    if not tel.tracing:
        return _NOTHING
    return _opening(tel, name, batch_id)


@contextmanager
def _opening(tel: Telemetry, name: str, batch_id: str) -> Iterator[str | None]:
    attrs = {**tel.attributes, ATTR_BATCH_ID: batch_id}
    with tel.tracer.start_as_current_span(name, attributes=attrs) as span:
        context = span.get_span_context()
        yield traceparent(context) if span.is_recording() and context.is_valid else None


def batch_links(headers: dict[str, str]) -> list[Link] | None:
    """The links a job's ``BATCH_TRACE_HEADER`` asks for (a batch callback's, a flow
    step's): to the span that opened its batch or started its flow (``aqw.link=batch``),
    then to each of a flow step's parents' ``aqw.flow.step`` spans (``aqw.link=parent``);
    None for any other job."""
    text = headers.get(BATCH_TRACE_HEADER)
    if text is None:
        return None
    links: list[Link] = []
    for i, part in enumerate(text.split()):
        context = parse_traceparent(part)
        if context is not None:
            links.append(Link(context, {ATTR_LINK_KIND: "parent" if i else "batch"}))
    return links or None


def step_spans(tel: Telemetry, flow_id: str, names: Iterable[str]) -> dict[str, str]:
    """One ``aqw.flow.step`` span per step of a flow (attribute ``aqw.flow.step``), children
    of the current span (the flow's ``aqw.flow.start``), each ended at once: a step's job
    carries its own as its ``traceparent`` (its ``process`` span is its child) and its
    dependants link to it. Their ``traceparent`` by name; none unless sampled."""
    out: dict[str, str] = {}
    for name in names:
        attrs = {**tel.attributes, ATTR_BATCH_ID: flow_id, ATTR_FLOW_STEP: name}
        span = tel.tracer.start_span(SPAN_FLOW_STEP, attributes=attrs)
        context = span.get_span_context()
        if span.is_recording() and context.is_valid:
            out[name] = traceparent(context)
        span.end()
    return out


def record_batch(tel: Telemetry, job: Job) -> None:
    """For a batch callback's first attempt (``job`` carries ``BATCH_INFO_HEADER``): count
    its batch complete (``aqw.batches.completed``, by ``aqw.batch.outcome``) and record its
    ``aqw.batch.duration``, when ``job`` is the batch's first callback (so each batch once,
    whichever callbacks it has). Counts that do not parse record nothing."""
    if job.attempt != 1:
        return
    try:
        info = BatchInfo.from_json(job.headers[BATCH_INFO_HEADER])
    except (ValueError, KeyError, TypeError, AttributeError):
        return
    job_id = job.id
    first = next((info.callbacks[k] for k in CALLBACK_KINDS if k in info.callbacks), None)
    if first != job_id:
        return
    tel.count_reason("aqw.batches.completed", None, info.outcome, ATTR_BATCH_OUTCOME)
    if info.created_at is not None and info.completed_at is not None:
        tel.observe("aqw.batch.duration", max(0.0, info.completed_at - info.created_at))


__all__ = [
    "BATCH_TRACE_HEADER",
    "batch_links",
    "opening",
    "parse_traceparent",
    "record_batch",
    "step_spans",
    "traceparent",
]
