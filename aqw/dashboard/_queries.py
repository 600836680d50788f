"""What each dashboard page reads, in bounded amounts: a fixed number of broker calls per
page, each of a bounded size (a page of entries, never a whole set). The numbers of the
overview are ``aqw status``'s (``aqw.status.gather_status``); the schedules are
``aqw cron list``'s (``aqw.schedules``)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .._readback import split_heartbeats, to_float, to_int
from .._redact import redact_payload
from ..app import DeadLetters
from ..brokers import CancelOutcome
from ..brokers.base import Broker, DeadJob
from ..brokers.batching import BATCH_HEADER
from ..job import Job
from ..monitor import is_monitor_heartbeat
from ..record import JobInfo
from ..status import gather_status
from ..task import Task
from ..timetable import SchedulesApp, schedule_rows
from ._format import reason

#: Entries per page of the running, delayed and dead-letter lists.
PAGE = 50
#: How many of the soonest-due delayed jobs the overview looks at to count retries.
RETRY_SCAN = 50
#: Seconds of depth history the overview's chart shows.
CHART_SPAN = 3600.0
#: Most characters of a payload shown; the rest is cut with a note of its size.
PAYLOAD_SHOWN = 4096


class DashboardApp(SchedulesApp, Protocol):
    """What the dashboard needs of the App (``aqw.App`` has it all)."""

    @property
    def queue(self) -> str: ...
    @property
    def dlq(self) -> DeadLetters: ...
    def get_task(self, name: str) -> Task[Any]: ...
    async def job(self, job_id: str) -> JobInfo | None: ...
    async def cancel(self, job_id: str) -> CancelOutcome: ...
    def lease_ttl_of(self, job: Job | None) -> float: ...
    @property
    def limits(self) -> RunTimeLimits: ...
    @property
    def progress(self) -> Callable[[str], AsyncIterator[Any]]: ...


class RunTimeLimits(Protocol):
    """``app.limits`` as the limits page uses it (``_limits.py``)."""

    async def show(self) -> list[dict[str, Any]]: ...
    async def set(
        self, name: str, rate: str | None = None, *, max_per_key: int | None = None
    ) -> None: ...
    async def reset(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Payload:
    """A job's payload as shown: its JSON text, cut at ``PAYLOAD_SHOWN`` characters."""

    text: str
    size: int
    cut: bool

    @classmethod
    def of(cls, value: Any) -> Payload:
        """``value`` as shown: secret-looking keys' values hidden (``redact_payload``)."""
        text = json.dumps(redact_payload(value), indent=2, ensure_ascii=False, default=str)
        size = len(text.encode("utf-8", "replace"))
        return cls(text[:PAYLOAD_SHOWN], size, len(text) > PAYLOAD_SHOWN)


def trace_id(job: Job | None) -> str | None:
    """The trace id of a job's ``traceparent`` header (W3C: ``00-<trace>-<span>-<flags>``)."""
    if job is None:
        return None
    parts = job.headers.get("traceparent", "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1].strip("0123456789abcdef") == "":
        return parts[1]
    return None


def batch_of(job: Job | None) -> str | None:
    """The batch (or flow) a job counts in, from its ``BATCH_HEADER`` (a flow step's names
    its flow first, then its dependants' gates); None for any other job."""
    if job is None:
        return None
    head = job.headers.get(BATCH_HEADER, "").split()
    return head[0] if head else None


def decode(data: bytes) -> Job | None:
    try:
        return Job.decode(data)
    except Exception:
        return None


async def overview(app: DashboardApp) -> dict[str, Any]:
    """The overview: ``aqw status``'s numbers, the retrying jobs among the ``RETRY_SCAN``
    soonest due, and the depth history of the last ``CHART_SPAN`` seconds."""
    status = await gather_status(app.broker, lease_ttl=app.lease_ttl_of)
    views = app.broker.history  # None: the broker keeps no history (SQS)
    soon = await views.delayed_page(0, RETRY_SCAN) if views is not None else []
    retrying = sum(1 for d in soon if (job := decode(d.data)) is not None and job.attempt > 1)
    history = await views.since(time.time() - CHART_SPAN) if views is not None else []
    control = app.broker.control  # None: the broker cannot pause the queue
    return {
        "status": status,
        "paused": await control.paused() if control is not None else None,
        "retrying": retrying,
        "retry_scan": min(RETRY_SCAN, len(soon)),
        "history": history,
    }


async def workers(app: DashboardApp) -> list[dict[str, Any]]:
    """The live workers from their heartbeats (one read, as ``aqw status``), by name; the
    monitor's heartbeat and damaged ones are left out."""
    beats, _ = split_heartbeats(await app.broker.status.heartbeats())
    rows = [
        {
            "worker": b.get("worker", ""),
            "host": b.get("host", ""),
            "pid": b.get("pid", ""),
            "state": b.get("state", ""),
            "paused": b.get("paused") is True,
            "concurrency": to_int(b.get("concurrency"), 0),
            "in_flight": to_int(b.get("in_flight"), 0),
            "last_beat": to_float(b.get("at"), 0.0),
            "version": b.get("version", ""),
        }
        for b in beats
        if not is_monitor_heartbeat(b)
    ]
    return sorted(rows, key=lambda r: str(r["worker"]))


async def running(app: DashboardApp) -> dict[str, Any]:
    """Up to ``PAGE`` running jobs (oldest start first), with the in-flight total, and the
    jobs blocked by a lease key no live worker holds (``aqw job release`` clears one)."""
    states = await app.broker.records.running_states(PAGE)
    depth = await app.broker.depth()
    rows = [
        {
            **s,
            "attempt": to_int(s.get("attempt"), 0),
            "started_at": to_float(s.get("started_at"), 0.0),
            "lease_expires_at": to_float(s.get("lease_expires_at"), 0.0),
            "progress": to_float(s.get("progress"), 0.0),
        }
        for s in states
    ]
    server = app.broker.server  # None: no lease keys to block a job (memory, SQS)
    blocked = await server.blocked_leases(app.lease_ttl_of) if server is not None else []
    return {"rows": rows, "total": max(depth.in_flight, len(rows)), "blocked": blocked}


async def delayed(app: DashboardApp, start: int) -> dict[str, Any]:
    """One page of the delayed set (retries included), soonest due first."""
    views = app.broker.history
    page = await views.delayed_page(start, PAGE) if views is not None else []
    depth = await app.broker.depth()
    rows = []
    for item in page:
        job = decode(item.data)
        rows.append(
            {
                "due": item.due,
                "job_id": job.id if job else "",
                "task": job.task if job else "(not a valid job)",
                "attempt": job.attempt if job else 0,
                "retrying": bool(job and job.attempt > 1),
            }
        )
    return {"rows": rows, "total": depth.delayed, "start": start, "page": PAGE}


async def schedules(app: DashboardApp) -> dict[str, Any]:
    """The periodic tasks (``aqw cron list``'s rows) and the worker whose scheduler leads
    (from the heartbeats; None when none says so)."""
    rows = await schedule_rows(app)
    leader = None
    if rows:
        beats, _ = split_heartbeats(await app.broker.status.heartbeats())
        leaders = sorted(str(b.get("worker")) for b in beats if b.get("scheduler_leader") is True)
        leader = leaders[0] if leaders else None
    return {"rows": rows, "leader": leader}


def fingerprint(dead: DeadJob) -> str:
    """A dead job's error group: its error type and the innermost frame of its traceback
    (where the worker's own fingerprint looks), hashed; the task stands in for the frame
    when there is no traceback."""
    frames = [
        line.strip() for line in dead.traceback.splitlines() if line.strip().startswith("File ")
    ]
    where = frames[-1] if frames else dead.task
    return hashlib.sha1(f"{dead.error_type}|{where}".encode()).hexdigest()[:12]


async def dead_letters(app: DashboardApp, after: str | None) -> dict[str, Any]:
    """One page of the dead-letter queue, oldest first, grouped by error fingerprint."""
    page = await app.broker.dlq_list(PAGE, after)
    depth = await app.broker.depth()
    groups: dict[str, dict[str, Any]] = {}
    for dead in page:
        fp = fingerprint(dead)
        group = groups.setdefault(
            fp, {"fingerprint": fp, "error_type": dead.error_type, "entries": []}
        )
        job = dead.job
        group["entries"].append({"dead": dead, "payload": Payload.of(job.payload) if job else None})
    ordered = sorted(groups.values(), key=lambda g: -len(g["entries"]))
    more = len(page) >= PAGE
    return {
        "groups": ordered,
        "total": depth.dead,
        "count": len(page),
        "next": page[-1].id if more else None,
        "after": after,
    }


async def dead_entry(app: DashboardApp, entry_id: str) -> dict[str, Any] | None:
    """One DLQ entry with its payload (for replay with an edited payload)."""
    dead = await app.broker.dlq_get(entry_id)
    if dead is None:
        return None
    job = dead.job
    return {
        "dead": dead,
        "job": job,
        "payload": Payload.of(job.payload) if job else None,
        "edit": json.dumps(job.payload, indent=2, ensure_ascii=False) if job else "",
    }


async def job_detail(app: DashboardApp, job_id: str) -> dict[str, Any]:
    """A job's record (``app.job``) and its envelope: from its DLQ entry when it is dead,
    from the queue while it waits, runs or is delayed (``control.find``): the payload
    (secrets hidden, cut with a size note), the trace id of its ``traceparent``, and the
    batch or flow it counts in (one more read, only for a job that carries one)."""
    info = await app.job(job_id)
    job: Job | None = None
    if info is not None and info.dlq_entry:
        dead = await app.broker.dlq_get(info.dlq_entry)
        job = dead.job if dead is not None else None
    control = app.broker.control
    if job is None and control is not None and info is not None and not info.finished:
        found = await control.find(job_id)  # waiting, running or delayed: its envelope
        job = decode(found) if found is not None else None
    batch_id, batch_page = batch_of(job), "batches"
    part = app.broker.batches
    if batch_id is not None and part is not None:  # a flow's step: link to the flow page
        batch = await part.info(batch_id)
        batch_page = "flows" if batch is not None and batch.data else "batches"
    return {
        "info": info,
        "job": job,
        "payload": Payload.of(job.payload) if job is not None else None,
        "trace_id": trace_id(job),
        "batch_id": batch_id,
        "batch_page": batch_page,
        "result": Payload.of(info.result) if info is not None and info.has_result else None,
    }


async def redis_health(broker: Broker) -> dict[str, Any]:
    """Used, peak and max memory and the eviction policy of the broker's server
    (``broker.server``); ``error`` says why they are not known (no server, or no INFO)."""
    if broker.server is None:
        return {"error": f"the {broker.system} broker has no Redis server"}
    try:
        return await broker.server.health()
    except broker.transient_errors:
        raise  # the broker is down: the broker-down page says so
    except Exception as exc:  # fakeredis has no INFO; a proxy may refuse it
        return {"error": f"INFO memory is not available: {reason(exc)}"}
