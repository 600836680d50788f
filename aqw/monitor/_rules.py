"""The monitor's three alert rules (``queue_depth``, ``retry_rate``, ``stuck_job``; see
``aqw.monitor._monitor``): each returns the alerts whose condition holds now, judged with the
thresholds of the ``Monitor`` it is given."""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._readback import to_float, to_int
from .._text import printable
from ..task import Task
from ._sinks import Alert


class RulesApp(Protocol):
    """What the rules read of the App: its tasks (their ``sla``)."""

    @property
    def tasks(self) -> Mapping[str, Task[Any]]: ...


class Monitor(Protocol):
    """The thresholds the rules judge by (``aqw.Monitor`` has them all)."""

    @property
    def app(self) -> RulesApp | None: ...

    queue: str
    baseline_halflife: float
    depth_factor: float
    depth_for: float
    depth_min: int
    max_job_alerts: int
    min_processed: int
    orphan_after: float
    retry_rate: float
    retry_window: float
    stuck_factor: float
    warmup: float


@dataclass(slots=True)
class Baseline:
    """The depth rule's learned state (published by the active monitor, restored on failover)."""

    value: float | None = None  # the learned depth
    since: float = 0.0  # the first sample
    at: float = 0.0  # the last sample
    above_since: float | None = None  # when the depth rose above the threshold


@dataclass(slots=True)
class _Window:
    processed: int = 0
    retried: int = 0
    dead: int = 0


def check_depth(m: Monitor, b: Baseline, now: float, depth: int) -> list[Alert]:
    """``queue_depth``: learns the baseline ``b`` from ``depth``, frozen while above it."""
    if b.value is None:
        b.value, b.since, b.at = float(depth), now, now
        return []
    warm = now - b.since >= m.warmup
    threshold = b.value * m.depth_factor
    if warm and depth > threshold and depth >= m.depth_min:
        if b.above_since is None:
            b.above_since = now
    else:
        b.above_since = None
        weight = 1.0 - 0.5 ** (max(0.0, now - b.at) / m.baseline_halflife)
        b.value += weight * (depth - b.value)
    b.at = now
    if b.above_since is None or now - b.above_since < m.depth_for:
        return []
    summary = (
        f"queue {m.queue!r}: {depth} jobs waiting, more than "
        f"{m.depth_factor:g}x its baseline of {b.value:.1f} for "
        f"{now - b.above_since:.0f}s"
    )
    details = {
        "depth": depth,
        "baseline": b.value,
        "threshold": threshold,
        "above_since": b.above_since,
    }
    return [Alert("queue_depth", m.queue, "warning", summary, details, now)]


def check_retries(m: Monitor, now: float, workers: list[dict[str, Any]]) -> list[Alert]:
    """``retry_rate``: retries per processed job over the workers' ``retry_window``."""
    window = "last_5m" if m.retry_window == 300.0 else "last_1m"
    w = _Window()
    for beat in workers:
        counts = beat.get(window) or {}
        w.processed += to_int(counts.get("processed"), 0)
        w.retried += to_int(counts.get("retried"), 0)
        w.dead += to_int(counts.get("dead"), 0)
    if w.processed + w.retried + w.dead < m.min_processed:
        return []
    rate = w.retried / w.processed if w.processed else math.inf
    if rate <= m.retry_rate:
        return []
    shown = "all" if math.isinf(rate) else f"{rate:.1%}"
    summary = (
        f"queue {m.queue!r}: retries at {shown} of processed jobs over "
        f"{m.retry_window:g}s ({w.retried} retried, {w.processed} processed), "
        f"above {m.retry_rate:.0%}"
    )
    details = {
        "processed": w.processed,
        "retried": w.retried,
        "dead": w.dead,
        "rate": None if math.isinf(rate) else rate,
        "window": m.retry_window,
        "workers": len(workers),
    }
    return [Alert("retry_rate", m.queue, "warning", summary, details, now)]


def _sla(m: Monitor, task: str) -> float | None:
    if m.app is None or task not in m.app.tasks:
        return None
    return m.app.tasks[task].options.sla


def check_stuck(
    m: Monitor,
    now: float,
    workers: list[dict[str, Any]],
    states: list[dict[str, str]],
    firing: Container[str],
) -> list[Alert]:
    """``stuck_job``: jobs over their SLA and orphaned jobs; those in ``firing`` are kept
    first when the alerts are capped."""
    out: dict[str, Alert] = {}
    for beat in workers:
        for job in beat.get("stuck") or []:
            if not isinstance(job, dict) or not isinstance(job.get("job_id"), str):
                continue  # damaged (aqw._readback.heartbeat_damage leaves such beats out)
            sla = to_float(job.get("sla"), 0.0)
            running_for = now - to_float(job.get("started_at"), now)
            if sla <= 0 or running_for <= m.stuck_factor * sla:
                continue
            summary = (
                f"job {printable(job['job_id'])} ({printable(job.get('task'))}) on "
                f"{printable(job.get('worker'))} has run {format_age(running_for)}, more than "
                f"{m.stuck_factor:g}x its SLA of {sla:g}s"
            )
            details = {**job, "reason": "sla", "running_for": running_for}
            out[job["job_id"]] = _stuck_alert(m, now, job["job_id"], summary, details)
    live = {str(b.get("worker")) for b in workers}
    for state in states:
        job_id, worker = state.get("job_id", ""), state.get("worker", "")
        if not job_id or job_id in out or worker in live:
            continue
        started = _float(state.get("started_at"), now)
        expires = _float(state.get("lease_expires_at"), math.inf)
        task_sla = _sla(m, state.get("task", ""))
        expected = m.stuck_factor * task_sla if task_sla else m.orphan_after
        if expires > now and now - started <= expected:
            continue
        why = (
            "its lease expired" if expires <= now else f"it started {format_age(now - started)} ago"
        )
        summary = (
            f"job {printable(job_id)} ({printable(state.get('task'))}) is orphaned: worker "
            f"{printable(worker)} no longer heartbeats and {why}"
        )
        details = {**state, "reason": "orphaned", "running_for": now - started}
        out[job_id] = _stuck_alert(m, now, job_id, summary, details)
    return _cap_job_alerts(m, now, list(out.values()), firing)


def _cap_job_alerts(
    m: Monitor, now: float, alerts: list[Alert], firing: Container[str]
) -> list[Alert]:
    if len(alerts) <= m.max_job_alerts:
        return alerts
    alerts.sort(key=lambda a: (a.key not in firing, now - a.details["running_for"]))
    kept, rest = alerts[: m.max_job_alerts], alerts[m.max_job_alerts :]
    summary = f"queue {m.queue!r}: {len(rest)} more stuck or orphaned jobs"
    details = {"count": len(rest), "job_ids": [a.details.get("job_id") for a in rest][:100]}
    return [*kept, _stuck_alert(m, now, "more", summary, details)]


def _stuck_alert(
    m: Monitor, now: float, job_id: str, summary: str, details: dict[str, Any]
) -> Alert:
    return Alert("stuck_job", m.queue, "warning", summary, details, now, key=f"stuck_job:{job_id}")


def format_age(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


def _float(value: str | None, default: float) -> float:
    return to_float(value, default)
