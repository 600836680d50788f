"""The autoscaling signal: how many workers a queue wants now (``aqw.queue.desired_workers``,
``aqw status --json``'s ``desired_workers``), from its depth and its arrival and service
rates, with its rate limits as a ceiling.

With a measured service time ``S`` (seconds per job, the workers' p50 over 5 minutes)::

    slots = leased + arrivals x S + (ready + due) x S / horizon

the jobs running keep their slots, arrivals (jobs/s: completions over the last minute plus
the backlog's growth over it, by conservation) need ``arrivals x S`` slots to be kept up
with, and the backlog (ready, plus delayed jobs due within the horizon) is drained within
the horizon. Without one (no worker has run yet, or all were scaled to zero) every job
wants a slot: ``slots = ready + leased + due``. A rate limit that holds every task of the
queue caps the slots that help at ``rate x S``: more workers would only wait for it.
``desired = ceil(slots / concurrency per worker)``, 0 when nothing waits, runs or arrives
(a queue can scale to zero)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ._readback import to_float, to_int
from .brokers.base import Broker
from .brokers.messages import QueueDepth
from .flow import FlowControl, stored_rate

#: Seconds within which a delayed job counts as due, and the backlog should be drained.
HORIZON = 60.0
#: Most delayed jobs counted as due (the soonest first).
MOST_DUE = 1000
#: A worker's concurrency when no heartbeat says (``App.worker``'s default).
DEFAULT_CONCURRENCY = 100


@dataclass(frozen=True, slots=True)
class ScalingInputs:
    """What ``desired_workers`` is computed from (``aqw status --json`` shows them)."""

    ready: int
    leased: int
    due: int
    arrivals: float
    service: float | None
    concurrency: int
    ceiling: float | None
    horizon: float = HORIZON

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def desired_workers(i: ScalingInputs) -> int:
    """The workers ``i`` asks for (module docstring)."""
    if i.service is None or i.service <= 0:
        slots = float(i.ready + i.leased + i.due)
    else:
        slots = i.leased + i.arrivals * i.service + (i.ready + i.due) * i.service / i.horizon
        if i.ceiling is not None:
            slots = min(slots, max(i.ceiling * i.service, 1.0))
    if slots <= 0:
        return 0
    return math.ceil(slots / max(1, i.concurrency) - 1e-9)


def rate_ceiling(
    flows: Iterable[FlowControl], changed: Mapping[str, str], names: list[str]
) -> float | None:
    """Starts per second the queue's tasks may make at most: the sum of their task-wide
    rate limits (as changed at run time), or None when one task has none (or one per key)."""
    total = 0.0
    for name, flow in zip(names, flows, strict=True):
        if flow.rate is None or flow.rate_key is not None:
            return None
        rate = stored_rate(changed.get(f"rate:{name}")) or flow.rate
        total += rate.count / rate.period
    return total if names else None


async def due_within(broker: Broker, horizon: float, now: float) -> int:
    """Delayed jobs due within ``horizon`` seconds (at most ``MOST_DUE``), from the broker's
    depth history part (0 without one)."""
    if broker.history is None:
        return 0
    page = await broker.history.delayed_page(0, MOST_DUE)
    return sum(1 for job in page if job.due <= now + horizon)


async def arrival_rate(broker: Broker, depth: QueueDepth, completed_1m: int, now: float) -> float:
    """Jobs arriving per second over the last minute: completions plus the backlog's growth
    since the depth history's sample of about a minute ago (completions alone without one)."""
    growth = 0.0
    if broker.history is not None:
        old = [s for s in await broker.history.since(now - 90) if s.at <= now - 50]
        if old:
            then = old[-1]
            backlog = depth.waiting + depth.in_flight + depth.delayed
            growth = (backlog - (then.waiting + then.in_flight + then.delayed)) / (now - then.at)
    return max(0.0, completed_1m / 60 + growth)


async def scaling_inputs(
    broker: Broker,
    depth: QueueDepth,
    workers: list[dict[str, Any]],
    tasks: Mapping[str, FlowControl] | None,
    now: float | None = None,
    horizon: float = HORIZON,
) -> ScalingInputs:
    """The inputs of one queue: its ``depth``, the live ``workers``' heartbeats and the
    app's ``tasks`` (name -> flow control; None: no app, no ceiling)."""
    now = time.time() if now is None else now
    workers = [b for b in workers if isinstance(b, dict) and b.get("kind") != "monitor"]
    completed = sum(to_int((b.get("last_1m") or {}).get("processed"), 0) for b in workers)
    service = max(
        (to_float((b.get("duration_5m") or {}).get("p50"), 0.0) for b in workers), default=0.0
    )
    counts = [to_int(b.get("concurrency"), 0) for b in workers]
    counts = [c for c in counts if c > 0]
    concurrency = round(sum(counts) / len(counts)) if counts else DEFAULT_CONCURRENCY
    ceiling = None
    if tasks:
        changed = await broker.run_limits.read() if broker.run_limits is not None else {}
        ceiling = rate_ceiling(tasks.values(), changed, list(tasks))
    return ScalingInputs(
        ready=depth.waiting,
        leased=depth.in_flight,
        due=await due_within(broker, horizon, now),
        arrivals=await arrival_rate(broker, depth, completed, now),
        service=service if service > 0 else None,
        concurrency=concurrency,
        ceiling=ceiling,
        horizon=horizon,
    )
