"""``aqw status``: one screen on a queue, built from the broker and the workers' heartbeats.

Where each number comes from:

- depth (waiting, in flight, delayed, dead-letter queue): the broker's ``depth()``;
- processed / failed / retried / dead and the retry rate over 1 and 5 minutes: the sums of
  the live workers' heartbeats (``last_1m``, ``last_5m``); the retry rate is retried /
  processed, as the monitor's ``retry_rate`` rule computes it;
- p50 / p99 processing time over 5 minutes: the **largest** of the workers' p50 and p99.
  Heartbeats carry quantiles, not histograms, so exact merging is impossible; the maximum is
  an upper bound that a single slow worker cannot hide behind fast ones;
- in flight (per worker) and active leases: sums over the workers;
- stuck jobs: the workers' ``stuck`` lists;
- top errors: the workers' error fingerprints, merged by fingerprint (counts summed);
- desired workers (``aqw.scaling``): from the depth, the delayed jobs due within a minute,
  the arrival and service rates (the heartbeats and the depth history) and the rate limits;
- alerts: the active monitor's heartbeat (``"kind": "monitor"``), which is not a worker
  and is left out of every sum;
- counters: the broker's lifetime ``stats()``;
- problems: damaged state found on the way (a heartbeat that is not JSON or not of a
  worker's shape, left out of every sum; on Redis, a fencing counter that would make every
  job lease fail, stats fields that are not integers, and job lease keys no live worker
  holds, which block their jobs: ``blocked``, the broker's ``server`` part). Everything
  printed from the broker is escaped, so stored terminal escapes never reach the screen.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ._readback import split_heartbeats, to_float, to_int
from ._text import printable
from .brokers.base import Broker
from .brokers.messages import BlockedLease
from .flow import rates_in_force
from .job import Job
from .monitor import format_age as _age
from .monitor import is_monitor_heartbeat
from .record import JobInfo
from .scaling import desired_workers, scaling_inputs

if TYPE_CHECKING:
    from .app import App

#: A job's lease TTL when no app says (``aqw.App``'s default).
DEFAULT_LEASE_TTL = 30.0

EVENTS = ("processed", "failed", "retried", "dead", "skipped")


async def gather_status(
    app_or_broker: App | Broker,
    release: str = "--app ...",
    lease_ttl: Callable[[Job | None], float] | None = None,
) -> dict[str, Any]:
    """Everything ``aqw status`` shows, as a JSON-able dict.

    Nothing read back is trusted (``aqw._readback``): a heartbeat that is not JSON or not of
    the shape workers publish is left out of every sum and named in ``problems``, as are a
    damaged fencing counter, stats counters that are not integers and lease keys no live
    worker holds (Redis; ``release``: how ``aqw job release`` names the app in the hint;
    ``lease_ttl``: a job's lease TTL, by default its task's in the app)."""
    app = None if isinstance(app_or_broker, Broker) else app_or_broker
    broker = app_or_broker if isinstance(app_or_broker, Broker) else app_or_broker.broker
    depth = await broker.depth()
    beats, problems = split_heartbeats(await broker.status.heartbeats())
    stats = await broker.stats()
    blocked: list[BlockedLease] = []
    if broker.server is not None:  # damage in the queue's own keys (Redis)
        problems += await broker.server.problems()
        ttl_of = lease_ttl or (app.lease_ttl_of if app is not None else _default_ttl)
        blocked = await broker.server.blocked_leases(ttl_of)
        problems += [b.problem(release) for b in blocked]
    workers = [b for b in beats if not is_monitor_heartbeat(b)]
    monitors = sorted(
        (b for b in beats if is_monitor_heartbeat(b)), key=lambda b: to_float(b.get("at"), 0.0)
    )
    now = time.time()
    windows = {w: _sum_window(workers, w) for w in ("last_1m", "last_5m")}
    monitor = monitors[-1] if monitors else None
    flows = {n: t.options.flow for n, t in app.tasks.items()} if app is not None else None
    scaling = await scaling_inputs(broker, depth, workers, flows, now)
    store = broker.run_limits  # the rate limits in force (an adaptive one's value now)
    rates = rates_in_force(flows or {}, await store.read() if flows and store else {})
    return {
        "queue": broker.queue,
        "at": now,
        "depth": depth.as_dict(),
        "workers": [
            _worker_row(b, now) for b in sorted(workers, key=lambda b: str(b.get("worker", "")))
        ],
        "concurrency": sum(to_int(b.get("concurrency"), 0) for b in workers),
        "in_flight": sum(to_int(b.get("in_flight"), 0) for b in workers),
        "leases": sum(to_int(b.get("leases"), 0) for b in workers),
        **windows,
        "duration_5m": {
            q: max(
                (to_float((b.get("duration_5m") or {}).get(q), 0.0) for b in workers), default=0.0
            )
            for q in ("p50", "p99")
        },
        "stuck": [job for b in workers for job in b.get("stuck") or []],
        "errors": _merge_errors(workers),
        "runaway": sorted({t for b in workers for t in b.get("runaway") or []}),
        "alerts": list(monitor.get("alerts") or []) if monitor else [],
        "monitor": None
        if monitor is None
        else {"name": monitor.get("monitor"), "at": monitor.get("at")},
        "counters": stats,
        "problems": problems,
        "blocked": [b.as_dict() for b in blocked],
        "heartbeats_local": _local_heartbeats(broker, bool(workers)),
        "in_process": broker.in_process,
        "desired_workers": desired_workers(scaling),  # the autoscaling signal (scaling.py)
        "scaling": scaling.as_dict(),
        "rate_limits": rates,
    }


def _default_ttl(job: Job | None) -> float:
    """A job's lease TTL when no app says: ``aqw.App``'s default."""
    return DEFAULT_LEASE_TTL


def _local_heartbeats(broker: Broker, seen: bool) -> str | None:
    """One line saying that the workers' heartbeats are kept in each worker's process (the
    broker's ``status`` part is not shared, and its queue is not this process's), when none
    is seen here; None otherwise."""
    if broker.status.shared or broker.in_process or seen:
        return None
    return (
        f"the {broker.system} broker keeps worker heartbeats in each worker's process: "
        "another process cannot list its workers"
    )


def _sum_window(workers: list[dict[str, Any]], window: str) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(EVENTS, 0)
    for beat in workers:
        for name, n in (beat.get(window) or {}).items():
            out[name] = out.get(name, 0) + to_int(n, 0)
    out["retry_rate"] = out["retried"] / out["processed"] if out["processed"] else None
    return out


def _worker_row(beat: dict[str, Any], now: float) -> dict[str, Any]:
    keys = ("worker", "pid", "state", "concurrency", "in_flight", "leases")
    row = {k: beat.get(k) for k in keys}
    row["seen_ago"] = max(0.0, now - to_float(beat.get("at"), now))
    return row


def _merge_errors(workers: list[dict[str, Any]], top: int = 10) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for beat in workers:
        for err in beat.get("errors") or []:
            fp = str(err.get("fingerprint", ""))
            seen = merged.get(fp)
            if seen is None:
                merged[fp] = dict(err)
                continue
            seen["count"] = to_int(seen.get("count"), 0) + to_int(err.get("count"), 0)
            if to_float(err.get("last_seen"), 0.0) > to_float(seen.get("last_seen"), 0.0):
                count = seen["count"]
                seen.update(err)
                seen["count"] = count
    rows = sorted(
        merged.values(),
        key=lambda e: (-to_int(e.get("count"), 0), -to_float(e.get("last_seen"), 0.0)),
    )
    return rows[:top]


# -- rendering ------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    if value <= 0:
        return "-"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _clock(at: Any, fmt: str = "%H:%M:%S") -> str:
    """A wall-clock time, or ``?`` for a value that is not a plausible time."""
    seconds = to_float(at, None)
    if seconds is None:
        return "?"
    try:
        return time.strftime(fmt, time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        return "?"


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    for row in rows:
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return [line.rstrip() for line in lines]


def _p(value: Any) -> str:
    """A value read from the broker, as text safe for a terminal (one line)."""
    return printable(value)


def _rates(status: dict[str, Any]) -> list[str]:
    """The rate limits in force (an ``Adaptive`` one's current value), as table lines."""
    keys, head = ("task", "now", "registered", "min"), ["TASK", "NOW", "REGISTERED", "ADAPTIVE MIN"]
    rows = [[_p(r[k] or "-") for k in keys] for r in status.get("rate_limits") or []]
    return ["", "rate limits:", *_table(head, rows)] if rows else []


def render(status: dict[str, Any]) -> str:
    """``status`` (from ``gather_status``) as a plain-text screen. Every string that came
    from the broker is escaped (``aqw._text.printable``): no terminal escape gets through."""
    d = status["depth"]
    when = _clock(status["at"], "%Y-%m-%d %H:%M:%S")
    out = [f"aqw status: queue {_p(status['queue'])}  ({when})", ""]
    problems = status.get("problems") or []
    if problems:
        out += [f"problems: {len(problems)}", *(f"  ! {_p(p)}" for p in problems), ""]
    out += _table(
        ["WAITING", "IN FLIGHT", "DELAYED", "DLQ"],
        [[str(d["waiting"]), str(d["in_flight"]), str(d["delayed"]), str(d["dead"])]],
    )
    workers = status["workers"]
    local = status.get("heartbeats_local")
    out += [
        "",
        f"workers: {_p(local)}"
        if local
        else f"workers {len(workers)}   concurrency {status['concurrency']}   "
        f"running {status['in_flight']}   leases {status['leases']}   "
        f"desired {status.get('desired_workers', '-')}"
        + ("   (in-process only)" if status.get("in_process") else ""),
    ]
    if workers:
        rows = [
            [
                _p(w["worker"]),
                _p(w["pid"]),
                _p(w["state"]),
                _p(w["in_flight"]),
                f"{_age(to_float(w['seen_ago'], 0.0))} ago",
            ]
            for w in workers
        ]
        out += _table(["WORKER", "PID", "STATE", "RUNNING", "HEARTBEAT"], rows)
    one, five = status["last_1m"], status["last_5m"]
    rows = [[_p(name), _p(one.get(name, 0)), _p(five.get(name, 0))] for name in EVENTS]
    rows.append(["retry rate", _rate(one["retry_rate"]), _rate(five["retry_rate"])])
    dur = status["duration_5m"]
    out += [
        "",
        *_table(["", "LAST 1M", "LAST 5M"], rows),
        f"  duration (5m, slowest worker): p50 {_seconds(dur['p50'])}   p99 {_seconds(dur['p99'])}",
        "",
    ]
    monitor = status["monitor"]
    seen = "" if monitor is None else f" (monitor {_p(monitor['name'])}, {_clock(monitor['at'])})"
    alerts = status["alerts"]
    out.append(f"alerts: {len(alerts)}{seen}" if monitor else "alerts: no monitor running")
    for a in alerts:
        out.append(
            f"  [{_p(a.get('severity'))}] {_p(a.get('rule'))} since "
            f"{_clock(a.get('fired_at'))}: {_p(a.get('summary'))}"
        )
    out += _rates(status)
    if status["stuck"]:
        rows = [
            [
                _p(j.get("job_id")),
                _p(j.get("task")),
                _age(status["at"] - to_float(j.get("started_at"), status["at"])),
                f"{_p(j.get('sla'))}s",
                _p(j.get("worker")),
            ]
            for j in status["stuck"]
        ]
        out += ["", "stuck jobs:", *_table(["JOB", "TASK", "RUNNING", "SLA", "WORKER"], rows)]
    if status["errors"]:
        rows = [
            [
                _p(e.get("count")),
                _p(e.get("error_type")),
                _p(e.get("task")),
                _p(str(e.get("message", "")).replace("\n", " "))[:60],
            ]
            for e in status["errors"]
        ]
        out += ["", "top errors (5m):", *_table(["COUNT", "ERROR", "TASK", "MESSAGE"], rows)]
    if status["runaway"]:
        out += ["", "retries running away: " + ", ".join(_p(t) for t in status["runaway"])]
    if status["counters"]:
        counters = "  ".join(f"{_p(k)}={_p(v)}" for k, v in sorted(status["counters"].items()))
        out += ["", f"lifetime: {counters}"]
    return "\n".join(out) + "\n"


#: Most characters of a job's result that the human view prints; past it the result is cut,
#: with a note of its size (``--json`` prints it whole).
RESULT_SHOWN = 2048


def render_time(at: datetime | float | None, now: float | None = None) -> str:
    """A time for people: its UTC date and how long ago (or from now) it is, e.g.
    ``2026-12-01 10:00:00 UTC (3m 12s ago)``; ``-`` for none, ``?`` for no plausible time."""
    if at is None:
        return "-"
    seconds = at.timestamp() if isinstance(at, datetime) else to_float(at, None)
    if seconds is None or seconds <= 0:
        return "?"
    try:
        date = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "?"
    delta = (time.time() if now is None else now) - seconds
    span = render_span(abs(delta))
    return f"{date} ({span} ago)" if delta >= 0 else f"{date} (in {span})"


def render_span(seconds: float) -> str:
    """A duration for people: ``4.2s``, ``42s``, ``3m 12s``, ``2h 5m``, ``3d 4h``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size:
            return f"{whole // size}{unit} {whole % size // sub_size}{sub}"
    return f"{whole // 60}m {whole % 60}s" if whole >= 60 else f"{whole}s"


def render_job(
    job_id: str, info: JobInfo | None, *, now: float | None = None, target: str = ""
) -> str:
    """One job's whole record for people (``aqw job show``, ``aqw status JOB_ID``), or that
    there is none. Every value read from the broker is escaped (``aqw._text.printable``);
    the traceback and the result (pretty JSON, cut past ``RESULT_SHOWN`` characters with
    a note of its size) are printed as lines. ``target``: the options the command of the
    DLQ hint needs to find the app (`` --app jobs:app``)."""
    if info is None:
        return f"job {_p(job_id)}: no record (never enqueued on this queue, or expired)\n"
    at = time.time() if now is None else now
    lines = [f"job {_p(info.id)}: {info.state}"]
    if info.damaged:
        names = ", ".join(_p(name) for name in info.damaged)
        lines.append(f"  ! damaged fields, read as their defaults: {names}")
    progress = f"{info.progress:.0%}" if info.progress or info.message else "-"
    if info.message:
        progress += f" {_p(info.message)}"
    error = info.error
    kept = _p(f"not kept: {info.result_note}") if info.result_note else ""
    running = info.state == "running"  # else the lease was released (or never taken)
    rows: list[tuple[str, str | None]] = [
        ("queue", _p(info.queue)),
        ("task", _p(info.task)),
        ("attempts", str(info.attempts)),
        ("enqueued", render_time(info.enqueued_at, at)),
        ("started", render_time(info.started_at, at)),
        ("finished", render_time(info.finished_at, at)),
        ("run at", render_time(info.run_at, at)),
        ("expires at", render_time(info.expires_at, at)),
        ("worker", _p(info.worker)),
        ("progress", progress),
        ("key", _p(info.key or "")),
        ("fencing token", str(info.fencing_token or "")),
        ("lease expires", render_time(info.lease_expires_at, at) if running else ""),
        ("cancel requested", "yes" if info.cancel_requested else "no"),
        ("result", None if info.has_result else kept),
        ("error type", _p(error.type) if error else ""),
        ("error", _p(error.message) if error else ""),
        ("fingerprint", _p(error.fingerprint) if error else ""),
    ]
    if info.dlq_entry:
        entry = _p(info.dlq_entry)
        rows.append(("dlq entry", f"{entry}  (aqw dlq show {entry}{_p(target)})"))
    lines += [f"  {name:<17} {value or '-'}" for name, value in rows if value is not None]
    if info.has_result:
        text = json.dumps(info.result, indent=2, ensure_ascii=False)
        lines += ["  result:", *(f"    {_p(line)}" for line in text[:RESULT_SHOWN].splitlines())]
        if len(text) > RESULT_SHOWN:
            size = len(text.encode("utf-8", "replace"))
            lines.append(f"    ... cut at {RESULT_SHOWN} characters of {size} bytes (--json: all)")
    if error is not None and error.traceback:
        shown_tb = printable(error.traceback.rstrip("\n"), keep_newlines=True)
        lines += ["  traceback:", *(f"    {line}" for line in shown_tb.split("\n"))]
    return "\n".join(lines) + "\n"
