"""OpenTelemetry spans and metrics: every name in one place.

The library uses ``opentelemetry-api`` only. With no SDK configured (the API's proxy
providers), tracing and metrics are switched off at the source: no span objects are made and
no instruments touched, so the overhead is a couple of attribute checks per job.

Spans (OpenTelemetry messaging semantic conventions):

- ``publish <queue>`` (PRODUCER) around enqueue; injects ``traceparent``/``tracestate`` into
  the job headers.
- ``process <queue>`` (CONSUMER) per job; continues the producer's trace (``link=False``,
  the default: a child) or starts a new trace linked to it (``link=True``). By default
  (``detail="job"``) it is the job's only span: current while the handler runs, with the
  stages as attributes (``aqw.receive_ms``, ``aqw.lease.acquire_ms``, ``aqw.handler_ms``,
  ``aqw.settle_ms``, ``aqw.settle.outcome``). With ``detail="stages"``, children:
  ``receive <queue>`` (the fetch that delivered it), ``aqw.lease.acquire``, ``aqw.handler``
  (current while the handler runs, so its own spans nest under it) and ``aqw.settle``.
  Events: ``aqw.lease.renewed``, ``aqw.lease.lost``, ``aqw.job.stuck`` (and, by default,
  ``aqw.lease.refused``).

- ``aqw.lock <name>`` around ``ctx.lock(...)`` acquisitions.
- ``aqw.batch.open`` around an ``async with app.batch(...)`` block, ``aqw.flow.start``
  around ``app.start(flow)``: their context is kept in the ``aqw-batch-trace`` header of
  the batch's callbacks and the flow's steps, whose ``process`` spans link to it
  (``aqw.link=batch``); each step of a flow is an ``aqw.flow.step`` span (ended at once),
  the parent of its ``process`` span and linked from its dependants' (``aqw.link=parent``).
  Metrics ``aqw.batches.completed`` (by ``aqw.batch.outcome``) and
  ``aqw.batch.duration``, recorded once per batch when its first callback starts.

A sampled-out job's non-recording span is still current while its handler runs, so the
handler's own spans follow the sampling decision; the producer's baggage is current too.

Counters are totals read at collection time. Histogram values are kept per (metric, queue,
task) and recorded into the SDK's histograms in batches: every ``MAX_PENDING`` values, at
each collection and when a worker stops (``Telemetry.flush``).

The package, one idea a module: ``_names`` (every span, event, attribute and metric name),
``_instruments`` (the meter's instruments, made once per meter provider), ``_telemetry``
(``Telemetry``), ``_job_trace`` (``JobTrace``: one job's ``process`` span and its children),
``_header_contexts`` (``HeaderContexts``: the trace context its headers carry) and
``_otel`` (``configure_otel``, ``shutdown_otel``, telling an SDK from the API's defaults).
"""

from __future__ import annotations

from ._batch_trace import BATCH_TRACE_HEADER, batch_links, opening, record_batch, step_spans
from ._job_trace import JobTrace, now_ns
from ._names import (
    ATTR_ATTEMPT,
    ATTR_BATCH_COUNT,
    ATTR_BATCH_ID,
    ATTR_BATCH_OUTCOME,
    ATTR_CONSUMER_GROUP,
    ATTR_DESTINATION,
    ATTR_DLQ_REASON,
    ATTR_FENCING_TOKEN,
    ATTR_FLOW_STEP,
    ATTR_HANDLER_MS,
    ATTR_LEASE_ACQUIRE_MS,
    ATTR_LEASE_WAIT,
    ATTR_LINK_KIND,
    ATTR_LOCK,
    ATTR_MESSAGE_ID,
    ATTR_OPERATION_NAME,
    ATTR_OPERATION_TYPE,
    ATTR_OUTCOME,
    ATTR_RECEIVE_MS,
    ATTR_RETRY_DELAY,
    ATTR_SETTLE_MS,
    ATTR_SYSTEM,
    ATTR_TASK,
    EVENT_LOST,
    EVENT_REFUSED,
    EVENT_RENEWED,
    EVENT_STUCK,
    METRICS,
    SCOPE,
    SPAN_BATCH_OPEN,
    SPAN_FLOW_START,
    SPAN_FLOW_STEP,
    SPAN_HANDLER,
    SPAN_LEASE,
    SPAN_LOCK,
    SPAN_PROCESS,
    SPAN_PUBLISH,
    SPAN_RECEIVE,
    SPAN_SETTLE,
    TRACE_DETAILS,
)
from ._otel import configure_otel, shutdown_otel
from ._telemetry import Telemetry

__all__ = [
    "ATTR_ATTEMPT",
    "ATTR_BATCH_COUNT",
    "ATTR_BATCH_ID",
    "ATTR_BATCH_OUTCOME",
    "ATTR_CONSUMER_GROUP",
    "ATTR_DESTINATION",
    "ATTR_DLQ_REASON",
    "ATTR_FENCING_TOKEN",
    "ATTR_FLOW_STEP",
    "ATTR_HANDLER_MS",
    "ATTR_LEASE_ACQUIRE_MS",
    "ATTR_LEASE_WAIT",
    "ATTR_LINK_KIND",
    "ATTR_LOCK",
    "ATTR_MESSAGE_ID",
    "ATTR_OPERATION_NAME",
    "ATTR_OPERATION_TYPE",
    "ATTR_OUTCOME",
    "ATTR_RECEIVE_MS",
    "ATTR_RETRY_DELAY",
    "ATTR_SETTLE_MS",
    "ATTR_SYSTEM",
    "ATTR_TASK",
    "BATCH_TRACE_HEADER",
    "EVENT_LOST",
    "EVENT_REFUSED",
    "EVENT_RENEWED",
    "EVENT_STUCK",
    "METRICS",
    "SCOPE",
    "SPAN_BATCH_OPEN",
    "SPAN_FLOW_START",
    "SPAN_FLOW_STEP",
    "SPAN_HANDLER",
    "SPAN_LEASE",
    "SPAN_LOCK",
    "SPAN_PROCESS",
    "SPAN_PUBLISH",
    "SPAN_RECEIVE",
    "SPAN_SETTLE",
    "TRACE_DETAILS",
    "JobTrace",
    "Telemetry",
    "batch_links",
    "configure_otel",
    "now_ns",
    "opening",
    "record_batch",
    "shutdown_otel",
    "step_spans",
]
