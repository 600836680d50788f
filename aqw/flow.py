"""Flow control: a task's rate limit and per-key concurrency cap, and the limits one job
starts under.

``@app.task(rate_limit="100/s", rate_key=..., concurrency_key=..., max_per_key=N)`` is
checked at registration (``flow_control``) into a ``FlowControl``; at start the worker asks
it for the job's ``Limits`` (``FlowControl.limits``, a function of the validated payload),
and the broker's start step (``Broker.job_lease_backend(job, limits)``) admits the job
under them in the same atomic step that hands out its lease, or refuses with
``aqw.RateLimited`` (the job then waits in the delayed set, without spending an attempt).

Rate limits are GCRA: starts are spaced ``period / count`` apart, with a burst of
``burst`` starts (1% of the count, at least 1) at once, so no window of one period holds
more than ``count + burst`` starts (``count + 1`` up to 199 per period). Per-key caps count the live
leases of the key's holders, so a crashed holder's slot ages out with its lease.

Limits changed at run time (``aqw limits``, ``app.limits``, an ``Adaptive`` limit) are a map
stored with the queue that ``with_overrides`` applies over a job's ``Limits``. Fair shares
(``Fairness``: ``fairness_key``, ``fairness_weight``) are picked in the broker's fetch step
(``aqw.brokers.parts.FairShares``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .job import MAX_WEIGHT, Job

#: The header that marks a debounced job (value ``"1"``). Its key is a debounce key, not an
#: idempotency key: it has no completion record, and at start a debounced job waits while
#: another job of the same key runs (concurrency key ``debounce:<key>``).
DEBOUNCE_HEADER = "aqw-debounce"

#: Seconds the record of a key's waiting job outlives its due time: a job still in the
#: delayed set that long after it was due (no worker promoted it) is no longer replaced.
DEBOUNCE_SLACK = 600.0


def is_debounced(job: Job) -> bool:
    """True when ``job`` was enqueued with ``debounce=``."""
    return job.headers.get(DEBOUNCE_HEADER) == "1"


def completion_key(job: Job | None) -> str | None:
    """The key under which ``job``'s completion record is written and checked: its
    idempotency key; None without a key, or for a debounced job (its key is a debounce
    key: a finished burst does not block the next one)."""
    if job is None or job.key is None or is_debounced(job):
        return None
    return job.key


def due_time(now: float, first: float, debounce: float, debounce_max: float | None) -> float:
    """When a debounced job whose burst began at ``first`` starts, as of an enqueue at
    ``now``: ``debounce`` seconds later, but no later than ``first + debounce_max``."""
    due = now + debounce
    return due if debounce_max is None else min(due, first + debounce_max)


#: Period units of a rate limit, in seconds.
PERIODS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}

_RATE = re.compile(r"\s*(\d+)\s*/\s*([a-z]+)\s*")

#: A key longer than this (of a rate bucket or a concurrency cap) is named by its digest.
MAX_KEY = 200

#: Seconds a job refused by a per-key cap waits before it is tried again: a random time in
#: this range (its holders' remaining lease, when shorter).
CAP_WAIT = (0.1, 0.5)


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` starts per ``period`` seconds."""

    count: int
    period: float

    @property
    def interval_us(self) -> int:
        """The time between two starts, in microseconds (at least 1)."""
        return max(1, round(self.period * 1e6 / self.count))

    @property
    def burst(self) -> int:
        """Starts admitted at once: 1% of the count, at least 1 (jobs started together in
        one script call have the same server time)."""
        return max(1, self.count // 100)

    @property
    def tolerance_us(self) -> int:
        """GCRA's burst tolerance: how far ahead of now the arrival time may be."""
        return self.interval_us * (self.burst - 1)

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "min", 3600.0: "h"}[self.period]
        return f"{self.count}/{unit}"


def parse_rate(value: object, task: str) -> Rate:
    """``"100/s"`` (also ``/m``, ``/min``, ``/h``, ``/sec``, ``/hour``) as a ``Rate``;
    anything else raises a ``ConfigError`` naming the task and ``rate_limit``."""
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    period = PERIODS.get(match.group(2)) if match else None
    if match is None or period is None or int(match.group(1)) < 1:
        raise ConfigError(
            f"task {task!r}: rate_limit must be '<count>/<s|m|min|h>' with a count >= 1 "
            f"(e.g. '100/s'), got {value!r}"
        )
    return Rate(int(match.group(1)), period)


def key_text(value: object) -> str:
    """A key function's result as a key name: its text, or a digest when it is long."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= MAX_KEY:
        return text
    return "sha1:" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Limits:
    """What one job starts under: its rate bucket (``aqw:{q}:rate:<bucket>`` on Redis), its
    interval and burst tolerance, and its per-key caps as (concurrency key, most holders)
    pairs (``aqw:{q}:slots:<key>``)."""

    bucket: str | None = None
    interval_us: int = 0
    tolerance_us: int = 0
    caps: tuple[tuple[str, int], ...] = ()

    def __bool__(self) -> bool:
        return self.bucket is not None or bool(self.caps)

    @property
    def cap_keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.caps)


def debounce_cap(job: Job) -> tuple[str, int] | None:
    """The implicit cap of a debounced job (``enqueue(..., key=k, debounce=s)``): one job of
    its key runs at a time, so a new job of the key waits for a started one to end."""
    if job.key is not None and is_debounced(job):
        return (f"debounce:{job.key}", 1)
    return None


@dataclass(frozen=True, slots=True)
class Adaptive:
    """``rate_limit=aqw.Adaptive("100/s", min="5/s")``: a task-wide rate limit that a
    handler's ``aqw.RateLimited`` (an upstream's 429) halves, down to ``min``, and that grows
    back by 5% of ``rate`` per second of successes, up to ``rate``: shared by every worker
    (stored with the queue as a limit changed at run time)."""

    rate: str
    min: str


@dataclass(frozen=True, slots=True)
class FlowControl:
    """A task's flow-control options, checked (``flow_control``)."""

    rate: Rate | None = None
    rate_key: Callable[[Any], object] | None = None
    concurrency_key: Callable[[Any], object] | None = None
    max_per_key: int | None = None
    #: The least an adaptive rate limit goes down to (``Adaptive.min``); None: not adaptive.
    floor: Rate | None = None

    @property
    def options(self) -> tuple[str, ...]:
        """The options set, by name (for a broker that cannot enforce them)."""
        named = (("rate_limit", self.rate), ("max_per_key", self.max_per_key))
        return tuple(name for name, value in named if value is not None)

    def limits(self, task: str, payload: Any, job: Job) -> Limits | None:
        """The limits ``job`` (of ``task``, with its validated ``payload``) starts under;
        None when it has none. A key function's error propagates (the job is retried)."""
        caps: list[tuple[str, int]] = []
        if self.concurrency_key is not None and self.max_per_key is not None:
            caps.append(
                (f"task:{task}:{key_text(self.concurrency_key(payload))}", self.max_per_key)
            )
        implicit = debounce_cap(job)
        if implicit is not None:
            caps.append(implicit)
        if self.rate is None:
            return Limits(caps=tuple(caps)) if caps else None
        bucket = task if self.rate_key is None else f"{task}:{key_text(self.rate_key(payload))}"
        return Limits(bucket, self.rate.interval_us, self.rate.tolerance_us, tuple(caps))


#: No flow control: every task's default.
NO_FLOW = FlowControl()


def flow_control(
    task: str,
    rate_limit: str | Adaptive | None = None,
    rate_key: Callable[[Any], object] | None = None,
    concurrency_key: Callable[[Any], object] | None = None,
    max_per_key: int | None = None,
) -> FlowControl:
    """Check ``@app.task``'s flow-control options; a bad one raises a ``ConfigError``
    naming the task and the option."""
    floor = None
    if isinstance(rate_limit, Adaptive):
        floor = parse_rate(rate_limit.min, task)
        rate_limit = rate_limit.rate
        if per_second(floor) > per_second(parse_rate(rate_limit, task)):
            raise ConfigError(f"task {task!r}: rate_limit: Adaptive's min is above its rate")
    rate = parse_rate(rate_limit, task) if rate_limit is not None else None
    if floor is not None and rate_key is not None:
        raise ConfigError(f"task {task!r}: an Adaptive rate_limit is task-wide: no rate_key")
    if rate_key is not None and not callable(rate_key):
        raise ConfigError(f"task {task!r}: rate_key must be a function of the payload")
    if rate_key is not None and rate is None:
        raise ConfigError(f"task {task!r}: rate_key needs a rate_limit")
    if concurrency_key is not None and not callable(concurrency_key):
        raise ConfigError(f"task {task!r}: concurrency_key must be a function of the payload")
    if max_per_key is not None and (
        isinstance(max_per_key, bool) or not isinstance(max_per_key, int) or max_per_key < 1
    ):
        raise ConfigError(
            f"task {task!r}: max_per_key must be an integer >= 1, got {max_per_key!r}"
        )
    if (concurrency_key is None) != (max_per_key is None):
        raise ConfigError(f"task {task!r}: concurrency_key and max_per_key go together")
    if rate is None and max_per_key is None:
        return NO_FLOW
    return FlowControl(rate, rate_key, concurrency_key, max_per_key, floor)


def cap_wait(holder_ms: int, draw: float) -> float:
    """Seconds a job refused by a per-key cap waits: ``draw`` (0-1) across ``CAP_WAIT``, or
    the holders' shortest remaining lease (``holder_ms``) when that is shorter."""
    low, high = CAP_WAIT
    wait = low + (high - low) * draw
    if 0 < holder_ms < wait * 1000:
        return max(0.001, holder_ms / 1000)
    return wait


def rate_wait(wait_us: int) -> float:
    """Seconds until a rate-limited job's turn (``wait_us`` from the script)."""
    return max(0.001, math.ceil(wait_us / 1000) / 1000)


def route_key(
    task: str, flow: FlowControl, payload: Any, key: str | None, group: str | None
) -> str | None:
    """The route of a job of ``task`` with the validated ``payload`` (what its key
    functions see), idempotency or debounce ``key`` and message ``group``; None: any
    partition.

    A task-wide rate limit keeps the whole task in one partition (its one GCRA bucket); a
    per-key cap wins over a rate key (a task with both should give them the same key, or
    its rate holds per partition) and both over an idempotency key (which should then
    name the same thing: the same key always with the same cap key)."""
    if flow.rate is not None and flow.rate_key is None:
        return f"task:{task}"
    if flow.concurrency_key is not None and flow.max_per_key is not None:
        return f"cap:{task}:{key_text(flow.concurrency_key(payload))}"
    if flow.rate_key is not None:
        return f"rate:{task}:{key_text(flow.rate_key(payload))}"
    if key is not None:
        return f"key:{key}"
    if group is not None:
        return f"group:{group}"
    return None


@dataclass(frozen=True, slots=True)
class Fairness:
    """A task's fair-share options (``@app.task(fairness_key=..., fairness_weight=...)``):
    each a function of the validated payload or a constant."""

    key: Callable[[Any], object] | str
    weight: Callable[[Any], object] | float = 1.0

    def of(self, task: str, payload: Any) -> tuple[str | None, float]:
        """(the fairness key, its weight) of a job of ``task`` with ``payload``; a key
        function's None: the job has no key. A bad weight raises a ``ConfigError``."""
        key = self.key(payload) if callable(self.key) else self.key
        weight = self.weight(payload) if callable(self.weight) else self.weight
        return (None if key is None else key_text(key)), check_weight(weight, task)


def check_weight(value: object, task: str) -> float:
    """``value`` as a fairness weight (a number > 0, at most ``MAX_WEIGHT``), else a
    ``ConfigError`` naming the task and ``fairness_weight``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 1 / MAX_WEIGHT <= value <= MAX_WEIGHT
    ):
        raise ConfigError(
            f"task {task!r}: fairness_weight must be a number from {1 / MAX_WEIGHT:g} to "
            f"{MAX_WEIGHT:g}, got {value!r}"
        )
    return float(value)


def fairness(task: str, key: object, weight: object) -> Fairness | None:
    """Check ``@app.task``'s fairness options; a bad one raises a ``ConfigError`` naming the
    task and the option."""
    if key is None:
        if weight is not None:
            raise ConfigError(f"task {task!r}: fairness_weight needs a fairness_key")
        return None
    if not callable(key) and not (isinstance(key, str) and key):
        raise ConfigError(
            f"task {task!r}: fairness_key must be a function of the payload or a non-empty "
            f"string, got {key!r}"
        )
    if weight is None:
        weight = 1.0
    if not callable(weight):
        weight = check_weight(weight, task)
    return Fairness(key, weight)


def with_overrides(limits: Limits, task: str, changed: dict[str, str]) -> Limits:
    """``limits`` (of a job of ``task``) under the limits changed at run time (``changed``,
    ``aqw.brokers.parts.RunLimits``'s map): ``rate:<task>:<key>`` for the job's rate
    bucket, else ``rate:<task>``; ``cap:<task>`` for its per-key caps. A stored value that
    does not parse is ignored (the registered limit holds)."""
    bucket, interval, tolerance = limits.bucket, limits.interval_us, limits.tolerance_us
    caps = limits.caps
    if bucket is not None:
        value = changed.get(f"rate:{bucket}") or changed.get(f"rate:{task}")
        rate = stored_rate(value)
        if rate is not None:
            interval, tolerance = rate.interval_us, rate.tolerance_us
    most = changed.get(f"cap:{task}")
    if most is not None and most.isdigit() and int(most) >= 1:
        mine = f"task:{task}:"
        caps = tuple((k, int(most) if k.startswith(mine) else n) for k, n in caps)
    return Limits(bucket, interval, tolerance, caps)


def stored_rate(value: str | None) -> Rate | None:
    """A stored run-time rate as a ``Rate``, or None when there is none or it is bad."""
    if value is None:
        return None
    try:
        return parse_rate(value, "")
    except ConfigError:
        return None


def per_second(rate: Rate) -> float:
    """Starts per second of ``rate``."""
    return rate.count / rate.period


def rate_text(starts_per_second: float) -> str:
    """A rate of ``starts_per_second`` as ``parse_rate`` reads it: per second, or per
    minute or hour below one a second (at least ``1/h``)."""
    if starts_per_second >= 1:
        return f"{round(starts_per_second)}/s"
    if starts_per_second * 60 >= 1:
        return f"{round(starts_per_second * 60)}/min"
    return f"{max(1, round(starts_per_second * 3600))}/h"


def rates_in_force(flows: dict[str, FlowControl], changed: dict[str, str]) -> list[dict[str, Any]]:
    """Each task-wide rate limit of ``flows`` (task -> flow control) in force under the
    run-time map ``changed``: ``task``, ``registered``, ``now`` (as text), ``per_second``
    (of ``now``), ``adaptive`` and ``min`` (an ``Adaptive``'s floor, else None)."""
    rows: list[dict[str, Any]] = []
    for task in sorted(flows):
        flow = flows[task]
        if flow.rate is not None:
            now = stored_rate(changed.get(f"rate:{task}")) or flow.rate
            floor = None if flow.floor is None else str(flow.floor)
            rows.append(
                {"task": task, "registered": str(flow.rate), "now": str(now)}
                | {"per_second": per_second(now), "adaptive": floor is not None, "min": floor}
            )
    return rows
