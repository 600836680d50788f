"""Every span, event, attribute and metric name aqw records, in one place."""

from __future__ import annotations

#: The instrumentation scope of aqw's tracer and meter.
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
EVENT_REFUSED = "aqw.lease.refused"

#: ``App(trace_detail=...)``: one ``process`` span per job with its stages as attributes
#: (``job``, the default), or with a child span per stage as well (``stages``).
TRACE_DETAILS = ("job", "stages")

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
SPAN_BATCH_OPEN = "aqw.batch.open"
SPAN_FLOW_START = "aqw.flow.start"
SPAN_FLOW_STEP = "aqw.flow.step"
ATTR_FLOW_STEP = "aqw.flow.step"
ATTR_BATCH_ID = "aqw.batch.id"
#: A link's kind: ``batch`` on a callback's or a step's link to its batch's or flow's span,
#: ``parent`` on a step's link to a parent step's ``aqw.flow.step`` span.
ATTR_LINK_KIND = "aqw.link"
ATTR_BATCH_OUTCOME = "aqw.batch.outcome"
# stage timings on the ``process`` span (trace_detail="job"), milliseconds
ATTR_RECEIVE_MS = "aqw.receive_ms"
ATTR_LEASE_ACQUIRE_MS = "aqw.lease.acquire_ms"
ATTR_HANDLER_MS = "aqw.handler_ms"
ATTR_SETTLE_MS = "aqw.settle_ms"

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
    "aqw.jobs.cancelled": ("counter", "{job}", "Jobs cancelled before or while running"),
    "aqw.jobs.expired": ("counter", "{job}", "Jobs not started before their expiry time"),
    "aqw.jobs.deferred": ("counter", "{job}", "Jobs put off by a limit, no attempt spent"),
    "aqw.jobs.duplicates_skipped": ("counter", "{job}", "Redelivered finished jobs skipped"),
    "aqw.jobs.stuck": ("counter", "{job}", "Jobs seen running past 2x their SLA"),
    "aqw.lease.renewals": ("counter", "{renewal}", "Successful lease renewals"),
    "aqw.lease.lost": ("counter", "{lease}", "Leases lost while held"),
    "aqw.batches.completed": ("counter", "{batch}", "Batches complete, by aqw.batch.outcome"),
    "aqw.batch.duration": ("histogram", "s", "Time from a batch's opening to its completion"),
    "aqw.lock.contended": ("counter", "{acquisition}", "Lock acquisitions refused or waited"),
    "aqw.lock.wait": ("histogram", "s", "Time spent waiting for a lock"),
    "aqw.cache.hits": ("counter", "{lookup}", "Cache lookups answered from the cache"),
    "aqw.cache.misses": ("counter", "{lookup}", "Cache lookups that missed"),
    "aqw.queue.depth": ("gauge", "{job}", "Jobs waiting to be fetched"),
    "aqw.queue.in_flight": ("gauge", "{job}", "Jobs delivered and not yet settled (queue-wide)"),
    "aqw.queue.delayed": ("gauge", "{job}", "Jobs scheduled for later"),
    "aqw.queue.dlq": ("gauge", "{job}", "Jobs in the dead-letter queue"),
    "aqw.queue.desired_workers": ("gauge", "{worker}", "Workers the queue wants now (autoscaling)"),
    "aqw.task.rate_limit": ("gauge", "{job}/s", "A task's rate limit in force (adaptive: now)"),
    "aqw.worker.in_flight": ("gauge", "{job}", "Jobs running in this worker"),
    "aqw.worker.loop_blocked": (
        "counter",
        "{stall}",
        "Event-loop stalls longer than a third of the shortest lease TTL",
    ),
}
