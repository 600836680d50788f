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
- alerts: the active monitor's heartbeat (``"kind": "monitor"``), which is not a worker
  and is left out of every sum;
- counters: the broker's lifetime ``stats()``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from .brokers.base import Broker
from .monitor import _secs as _age
from .monitor import is_monitor_heartbeat

if TYPE_CHECKING:
    from .app import App

EVENTS = ("processed", "failed", "retried", "dead", "skipped")


async def gather_status(app_or_broker: App | Broker) -> dict[str, Any]:
    """Everything ``aqw status`` shows, as a JSON-able dict."""
    broker = app_or_broker if isinstance(app_or_broker, Broker) else app_or_broker.broker
    depth = await broker.depth()
    beats = await broker.heartbeats()
    stats = await broker.stats()
    workers = [b for b in beats if not is_monitor_heartbeat(b)]
    monitors = sorted((b for b in beats if is_monitor_heartbeat(b)), key=lambda b: b.get("at", 0))
    now = time.time()
    windows = {w: _sum_window(workers, w) for w in ("last_1m", "last_5m")}
    monitor = monitors[-1] if monitors else None
    return {
        "queue": broker.queue,
        "at": now,
        "depth": depth.as_dict(),
        "workers": [
            _worker_row(b, now) for b in sorted(workers, key=lambda b: b.get("worker", ""))
        ],
        "concurrency": sum(int(b.get("concurrency", 0)) for b in workers),
        "in_flight": sum(int(b.get("in_flight", 0)) for b in workers),
        "leases": sum(int(b.get("leases", 0)) for b in workers),
        **windows,
        "duration_5m": {
            q: max((float((b.get("duration_5m") or {}).get(q, 0.0)) for b in workers), default=0.0)
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
    }


def _sum_window(workers: list[dict[str, Any]], window: str) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(EVENTS, 0)
    for beat in workers:
        for name, n in (beat.get(window) or {}).items():
            out[name] = out.get(name, 0) + int(n)
    out["retry_rate"] = out["retried"] / out["processed"] if out["processed"] else None
    return out


def _worker_row(beat: dict[str, Any], now: float) -> dict[str, Any]:
    keys = ("worker", "pid", "state", "concurrency", "in_flight", "leases")
    row = {k: beat.get(k) for k in keys}
    row["seen_ago"] = max(0.0, now - float(beat.get("at", now)))
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
            seen["count"] = int(seen.get("count", 0)) + int(err.get("count", 0))
            if float(err.get("last_seen", 0)) > float(seen.get("last_seen", 0)):
                count = seen["count"]
                seen.update(err)
                seen["count"] = count
    rows = sorted(
        merged.values(), key=lambda e: (-int(e.get("count", 0)), -float(e.get("last_seen", 0)))
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


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    for row in rows:
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return [line.rstrip() for line in lines]


def render(status: dict[str, Any]) -> str:
    """``status`` (from ``gather_status``) as a plain-text screen."""
    d = status["depth"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["at"]))
    out = [f"aqw status: queue {status['queue']}  ({when})", ""]
    out += _table(
        ["WAITING", "IN FLIGHT", "DELAYED", "DLQ"],
        [[str(d["waiting"]), str(d["in_flight"]), str(d["delayed"]), str(d["dead"])]],
    )
    workers = status["workers"]
    out += [
        "",
        f"workers {len(workers)}   concurrency {status['concurrency']}   "
        f"running {status['in_flight']}   leases {status['leases']}",
    ]
    if workers:
        rows = [
            [
                str(w["worker"]),
                str(w["pid"]),
                str(w["state"]),
                str(w["in_flight"]),
                f"{_age(w['seen_ago'])} ago",
            ]
            for w in workers
        ]
        out += _table(["WORKER", "PID", "STATE", "RUNNING", "HEARTBEAT"], rows)
    one, five = status["last_1m"], status["last_5m"]
    rows = [[name, str(one[name]), str(five[name])] for name in EVENTS]
    rows.append(["retry rate", _rate(one["retry_rate"]), _rate(five["retry_rate"])])
    dur = status["duration_5m"]
    out += [
        "",
        *_table(["", "LAST 1M", "LAST 5M"], rows),
        f"  duration (5m, slowest worker): p50 {_seconds(dur['p50'])}   p99 {_seconds(dur['p99'])}",
        "",
    ]
    monitor = status["monitor"]
    seen = "" if monitor is None else f" (monitor {monitor['name']}, {_clock(monitor['at'])})"
    alerts = status["alerts"]
    out.append(f"alerts: {len(alerts)}{seen}" if monitor else "alerts: no monitor running")
    for a in alerts:
        out.append(f"  [{a['severity']}] {a['rule']} since {_clock(a['fired_at'])}: {a['summary']}")
    if status["stuck"]:
        rows = [
            [
                str(j.get("job_id")),
                str(j.get("task")),
                _age(status["at"] - float(j.get("started_at", status["at"]))),
                f"{j.get('sla')}s",
                str(j.get("worker")),
            ]
            for j in status["stuck"]
        ]
        out += ["", "stuck jobs:", *_table(["JOB", "TASK", "RUNNING", "SLA", "WORKER"], rows)]
    if status["errors"]:
        rows = [
            [
                str(e.get("count")),
                str(e.get("error_type")),
                str(e.get("task")),
                str(e.get("message", "")).replace("\n", " ")[:60],
            ]
            for e in status["errors"]
        ]
        out += ["", "top errors (5m):", *_table(["COUNT", "ERROR", "TASK", "MESSAGE"], rows)]
    if status["runaway"]:
        out += ["", "retries running away: " + ", ".join(status["runaway"])]
    if status["counters"]:
        counters = "  ".join(f"{k}={v}" for k, v in sorted(status["counters"].items()))
        out += ["", f"lifetime: {counters}"]
    return "\n".join(out) + "\n"


def render_job(job_id: str, state: dict[str, str] | None) -> str:
    """One job's running state, or that it is not running."""
    if state is None:
        return f"job {job_id}: not running (finished, waiting, or unknown)\n"
    lines = [f"job {job_id}: {state.get('state', 'running')}"]
    for key in (
        "task",
        "attempt",
        "worker",
        "started_at",
        "lease_expires_at",
        "fencing_token",
        "progress",
        "message",
    ):
        value = state.get(key, "")
        if key in ("started_at", "lease_expires_at") and value:
            value = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(value)))
        lines.append(f"  {key:<17} {value}")
    return "\n".join(lines) + "\n"


# -- `aqw status` ---------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """Add ``aqw status`` to the command line's subparsers."""
    from .cli import _add_target

    p = sub.add_parser("status", help="queue depth, rates, workers, alerts; or one job's state")
    _add_target(p, positional_app=False)
    p.add_argument("job_id", nargs="?", help="show this job's running state instead")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS")


async def run(args: argparse.Namespace) -> int:
    """``aqw status [JOB_ID] [--json] [--watch SECONDS]``."""
    from .cli import resolve_app

    app = resolve_app(args, need_app=False)
    try:
        if getattr(args, "job_id", None):
            state = await app.job_status(args.job_id)
            if args.json:
                print(
                    json.dumps(
                        {"job_id": args.job_id, "running": state is not None, "state": state},
                        indent=2,
                    )
                )
            else:
                sys.stdout.write(render_job(args.job_id, state))
            return 0
        if not getattr(args, "watch", None):
            _show(await gather_status(app), args.json, clear=False)
            return 0
        await _watch(app, float(args.watch), args.json)
        return 0
    finally:
        await app.close()


def _show(status: dict[str, Any], as_json: bool, clear: bool) -> None:
    text = json.dumps(status, indent=2) + "\n" if as_json else render(status)
    sys.stdout.write(("\x1b[2J\x1b[H" if clear else "") + text)
    sys.stdout.flush()


async def _watch(app: App, every: float, as_json: bool) -> None:
    """Refresh every ``every`` seconds until Ctrl-C (SIGINT) or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            _show(await gather_status(app), as_json, clear=not as_json)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(every, 0.1)):
                    await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
