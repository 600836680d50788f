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
- counters: the broker's lifetime ``stats()``;
- problems: damaged state found on the way (a heartbeat that is not JSON or not of a
  worker's shape, left out of every sum; on Redis, a fencing counter that would make every
  job lease fail, and stats fields that are not integers). Everything printed from the
  broker is escaped, so stored terminal escapes never reach the screen.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ._damage import shown, split_heartbeats, to_float, to_int
from ._redis.lease import RedisLeaseBackend
from ._text import printable
from .brokers.base import Broker
from .brokers.redis import RedisBroker
from .monitor import format_age as _age
from .monitor import is_monitor_heartbeat

if TYPE_CHECKING:
    from .app import App

EVENTS = ("processed", "failed", "retried", "dead", "skipped")


async def gather_status(app_or_broker: App | Broker) -> dict[str, Any]:
    """Everything ``aqw status`` shows, as a JSON-able dict.

    Nothing read back is trusted (``aqw._damage``): a heartbeat that is not JSON or not of
    the shape workers publish is left out of every sum and named in ``problems``, as are a
    damaged fencing counter and stats counters that are not integers (Redis)."""
    broker = app_or_broker if isinstance(app_or_broker, Broker) else app_or_broker.broker
    depth = await broker.depth()
    beats, problems = split_heartbeats(await broker.heartbeats())
    stats = await broker.stats()
    problems += await _redis_problems(broker)
    workers = [b for b in beats if not is_monitor_heartbeat(b)]
    monitors = sorted(
        (b for b in beats if is_monitor_heartbeat(b)), key=lambda b: to_float(b.get("at"), 0.0)
    )
    now = time.time()
    windows = {w: _sum_window(workers, w) for w in ("last_1m", "last_5m")}
    monitor = monitors[-1] if monitors else None
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
    }


async def _redis_problems(broker: Broker) -> list[str]:
    """Damage in a Redis queue's own keys: a fencing counter that would make every job lease
    fail (``aqw.errors.FenceCorrupted``), and stats fields that are not integers."""
    if not isinstance(broker, RedisBroker):
        return []
    out: list[str] = []
    fence = broker.keys.fence
    if await _key_type(broker, fence) not in ("string", "none"):
        why: str | None = "not a string"
    else:
        why = RedisLeaseBackend.fence_damage(await broker.client.get(fence))
    if why is not None:
        out.append(
            f"fencing counter {fence} is damaged: {why}; no job lease can be taken until "
            f"it is SET to an integer above every fencing token handed out "
            f"(below {RedisLeaseBackend.FENCE_LIMIT})"
        )
    if await _key_type(broker, broker.keys.stats) not in ("hash", "none"):
        out.append(f"the stats key {broker.keys.stats} is not a hash")
        return out
    cursor: Any = 0
    seen = 0
    while True:
        reply: Any = await broker.client.hscan(broker.keys.stats, cursor, count=1000)
        cursor, fields = reply
        for name, value in fields.items():
            if to_int(value, None) is None:
                out.append(
                    f"damaged counter {shown(name)} in {broker.keys.stats}: "
                    f"{shown(value)} is not an integer"
                )
        seen += len(fields)
        if not int(cursor) or seen >= 1000 or len(out) >= 20:
            break
    return out


async def _key_type(broker: RedisBroker, key: str) -> str:
    """The Redis type of ``key`` (``none`` when it does not exist), read with TYPE rather
    than by catching WRONGTYPE: only the Redis plumbing imports redis."""
    kind: Any = await broker.client.type(key)
    return kind.decode() if isinstance(kind, bytes) else str(kind)


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
    out += [
        "",
        f"workers {len(workers)}   concurrency {status['concurrency']}   "
        f"running {status['in_flight']}   leases {status['leases']}",
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


def render_job(job_id: str, state: dict[str, str] | None) -> str:
    """One job's running state, or that it is not running (every value escaped)."""
    if state is None:
        return f"job {_p(job_id)}: not running (finished, waiting, or unknown)\n"
    lines = [f"job {_p(job_id)}: {_p(state.get('state', 'running'))}"]
    if state.get("damaged"):
        lines.append(f"  ! damaged state: {_p(state['damaged'])}")
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
            value = _clock(value, "%Y-%m-%d %H:%M:%S")
        lines.append(f"  {key:<17} {_p(value)}")
    return "\n".join(lines) + "\n"
