"""The seed's alert rules, evaluated live, with one active evaluator per queue.

Three rules (``docs/alerts/prometheus-rules.yml`` ships the same rules for Prometheus):

``queue_depth``
    The waiting depth (``QueueDepth.waiting``, the ``aqw.queue.depth`` gauge) is more than
    ``depth_factor`` x its baseline for ``depth_for`` seconds. The baseline is an
    exponentially weighted mean of the sampled depth, weighted by time (half-life
    ``baseline_halflife``), so irregular sampling does not skew it. Learning is frozen while
    the condition holds, so a sustained rise never becomes the new normal; the rule stays
    silent until the baseline has ``warmup`` seconds of history and the depth is at least
    ``depth_min`` jobs (an idle queue's baseline is ~0: five jobs are not an incident).
``retry_rate``
    Retries exceed ``retry_rate`` of processed (acknowledged) jobs over the last 5 minutes,
    summed over the live workers' heartbeats (``last_5m``). The rule needs at least
    ``min_processed`` settled jobs (processed + retried + dead) in the window; with none
    processed and retries seen the rate is infinite (as ``x / 0`` in PromQL) and fires.
``stuck_job``
    One alert per job: a job a worker reports running longer than ``stuck_factor`` x its
    task's ``sla`` (the heartbeats' ``stuck`` lists), or an *orphaned* job: a published
    running state whose worker no longer heartbeats and whose lease has expired or which
    started longer ago than expected (``stuck_factor`` x the task's sla when the monitor was
    given the app, else ``orphan_after``). It resolves when the job finishes or vanishes.

Alerts fire and resolve; each transition goes to every sink (``LogSink``,
``WebhookSink``, ``CallbackSink``, or any object with ``async emit(alert)``).

Only one monitor per queue evaluates: it holds the lease ``aqw:{queue}:monitor``; others
stand by and retry, and take over when the holder stops or dies (its lease expires). The
active monitor publishes its active alerts and its learned state as a heartbeat named
``monitor:<queue>`` whose data has ``"kind": "monitor"``; ``aqw status`` shows those alerts
and leaves that heartbeat out of the worker sums, and a monitor taking over restores the
baseline and the active alerts from it, so a failover neither forgets nor re-fires.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import json
import logging
import math
import signal
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ._ids import consumer_name
from .brokers.base import Broker
from .errors import ConfigError, LeaseLost, LeaseUnavailable
from .lease import Lease

if TYPE_CHECKING:
    from .app import App

log = logging.getLogger("aqw.monitor")

#: ``kind`` of the heartbeat a monitor publishes (not a worker's).
MONITOR_KIND = "monitor"


def is_monitor_heartbeat(beat: dict[str, Any]) -> bool:
    """True for the heartbeat a ``Monitor`` publishes, False for a worker's."""
    return beat.get("kind") == MONITOR_KIND


@dataclass(slots=True)
class Alert:
    """One alert: fired at ``fired_at``, active until ``resolved_at`` is set.

    ``key`` tells alerts of one rule apart (``stuck_job:<job id>``); it is the rule name for
    the queue-wide rules."""

    rule: str
    queue: str
    severity: str
    summary: str
    details: dict[str, Any]
    fired_at: float
    resolved_at: float | None = None
    key: str = ""

    def __post_init__(self) -> None:
        self.key = self.key or self.rule

    @property
    def active(self) -> bool:
        """True until the alert resolves."""
        return self.resolved_at is None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Alert:
        """The inverse of ``as_dict``."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# -- sinks ----------------------------------------------------------------------------------


class Sink(Protocol):
    """Where alert transitions go: ``emit`` is called when an alert fires and when it
    resolves (``alert.resolved_at`` set)."""

    async def emit(self, alert: Alert) -> None: ...


class LogSink(Sink):
    """Logs firing alerts at ``level`` (default WARNING) and resolutions at INFO."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.WARNING) -> None:
        self.logger = logger or log
        self.level = level

    async def emit(self, alert: Alert) -> None:
        if alert.active:
            self.logger.log(
                self.level,
                "ALERT %s [%s] queue=%s: %s",
                alert.key,
                alert.severity,
                alert.queue,
                alert.summary,
            )
        else:
            self.logger.info("RESOLVED %s queue=%s: %s", alert.key, alert.queue, alert.summary)


class CallbackSink(Sink):
    """Calls ``fn(alert)``; ``fn`` may be a plain function or a coroutine function."""

    def __init__(self, fn: Callable[[Alert], Any]) -> None:
        self.fn = fn

    async def emit(self, alert: Alert) -> None:
        result = self.fn(alert)
        if inspect.isawaitable(result):
            await result


class WebhookSink(Sink):
    """POSTs ``{"status": "firing" | "resolved", "alert": {...}}`` as JSON to ``url``, with
    httpx when installed, else urllib in a thread. A failure is logged and counted in
    ``failures``; it never raises into the monitor."""

    def __init__(
        self, url: str, *, timeout: float = 5.0, headers: dict[str, str] | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"webhook URL must be http:// or https://, got {url!r}")
        self.url = url
        self.timeout = timeout
        self.headers = {"content-type": "application/json", **(headers or {})}
        self.sent = 0
        self.failures = 0

    async def emit(self, alert: Alert) -> None:
        body = json.dumps(
            {"status": "firing" if alert.active else "resolved", "alert": alert.as_dict()},
            default=str,
        ).encode()
        try:
            async with asyncio.timeout(self.timeout + 1.0):
                await self._post(body)
            self.sent += 1
        except Exception as exc:
            self.failures += 1
            log.warning("webhook %s failed for alert %s: %r", self.url, alert.key, exc)

    async def _post(self, body: bytes) -> None:
        try:
            import httpx
        except ImportError:  # pragma: no cover - httpx is a dev dependency
            await asyncio.to_thread(self._post_urllib, body)
            return
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            response = await client.post(self.url, content=body, headers=self.headers)
            response.raise_for_status()

    def _post_urllib(self, body: bytes) -> None:
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()


# -- the monitor ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Baseline:
    value: float | None = None  # the learned depth
    since: float = 0.0  # the first sample
    at: float = 0.0  # the last sample
    above_since: float | None = None  # when the depth rose above the threshold


@dataclass(slots=True)
class _Window:
    processed: int = 0
    retried: int = 0
    dead: int = 0


class Monitor:
    """Evaluates the alert rules of one queue and sends transitions to ``sinks``.

    Args:
        app_or_broker: an ``aqw.App`` (its tasks' ``sla`` then help judge orphans) or
            a ``aqw.Broker``.
        sinks: where alerts go (default: a ``LogSink``).
        clock: wall-clock seconds; inject one to test the rules' timing.
        interval: seconds between evaluations.
        depth_factor, depth_for, baseline_halflife, warmup, depth_min: the depth rule (see
            the module doc); ``warmup`` defaults to one half-life.
        retry_rate, retry_window, min_processed: the retry rule; ``retry_window`` is 300
            (the heartbeats' ``last_5m``) or 60 (``last_1m``).
        stuck_factor, orphan_after: the stuck-job rule. At most ``max_job_alerts`` jobs get
            an alert of their own (those already firing, then the oldest); the rest are counted
            in one ``stuck_job:more`` alert, so a thousand hung jobs do not page a thousand times.
        lease_ttl: seconds the evaluator lease lives (default ``max(3 * interval, 30)``).
        name: this monitor's name (default: host, pid and a random suffix).

    Use ``async with monitor:`` to run it in the background, ``run`` to run it in the
    current task, or ``evaluate_once`` to evaluate once now, without the lease.
    """

    def __init__(
        self,
        app_or_broker: App | Broker,
        *,
        sinks: Sequence[Sink] | None = None,
        clock: Callable[[], float] = time.time,
        interval: float = 15.0,
        depth_factor: float = 1.5,
        depth_for: float = 600.0,
        baseline_halflife: float = 3600.0,
        warmup: float | None = None,
        depth_min: int = 10,
        retry_rate: float = 0.05,
        retry_window: float = 300.0,
        min_processed: int = 20,
        stuck_factor: float = 2.0,
        orphan_after: float = 300.0,
        max_job_alerts: int = 20,
        lease_ttl: float | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(app_or_broker, Broker):
            self.broker, self.app = app_or_broker, None
        else:
            self.broker, self.app = app_or_broker.broker, app_or_broker
        if interval <= 0 or depth_factor <= 0 or baseline_halflife <= 0 or stuck_factor <= 0:
            raise ConfigError(
                "Monitor interval, depth_factor, baseline_halflife and stuck_factor must be > 0"
            )
        if retry_window not in (60.0, 300.0):
            raise ConfigError(
                f"Monitor retry_window must be 60 or 300 seconds (the windows "
                f"workers report), got {retry_window!r}"
            )
        self.queue = self.broker.queue
        self.sinks: list[Sink] = list(sinks) if sinks is not None else [LogSink()]
        self.clock = clock
        self.interval = interval
        self.depth_factor = depth_factor
        self.depth_for = depth_for
        self.baseline_halflife = baseline_halflife
        self.warmup = baseline_halflife if warmup is None else warmup
        self.depth_min = depth_min
        self.retry_rate = retry_rate
        self.retry_window = retry_window
        self.min_processed = min_processed
        self.stuck_factor = stuck_factor
        self.orphan_after = orphan_after
        self.max_job_alerts = max_job_alerts
        self.lease_ttl = lease_ttl if lease_ttl is not None else max(3 * interval, 30.0)
        self.name = name or f"monitor-{consumer_name()}"
        self.lease_key = f"aqw:{{{self.queue}}}:monitor"
        self.heartbeat_name = f"monitor:{self.queue}"
        self.evaluations = 0
        self._baseline = _Baseline()
        self._active_alerts: dict[str, Alert] = {}
        self._is_active = False
        self._connected = False
        self._last_at: float | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- public surface --------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        """True while this monitor holds the evaluator lease."""
        return self._is_active

    @property
    def baseline(self) -> float | None:
        """The learned waiting depth (None before the first sample)."""
        return self._baseline.value

    def active_alerts(self) -> list[Alert]:
        """The alerts firing now, oldest first."""
        return sorted(self._active_alerts.values(), key=lambda a: (a.fired_at, a.key))

    async def evaluate_once(self) -> list[Alert]:
        """Sample the queue, evaluate every rule, send transitions to the sinks and publish
        the active alerts. Returns the alerts that fired or resolved now. Does not take the
        evaluator lease (``run`` does)."""
        if not self._connected:
            await self.broker.connect()
            self._connected = True
        now = self.clock()
        depth = await self.broker.depth()
        workers = [b for b in await self.broker.heartbeats() if not is_monitor_heartbeat(b)]
        states = await self.broker.job_states()
        firing: dict[str, Alert] = {}
        for alert in (
            *self._check_depth(now, depth.waiting),
            *self._check_retries(now, workers),
            *self._check_stuck(now, workers, states),
        ):
            firing[alert.key] = alert
        changes = self._transition(now, firing)
        self._last_at = now
        self.evaluations += 1
        try:  # first, so `aqw status` shows an alert by the time someone is paged
            await self._publish(now)
        except Exception as exc:
            log.warning("monitor %s: could not publish its alerts (%r)", self.name, exc)
        for alert in changes:
            await self._emit(alert)
        return changes

    async def run(self) -> None:
        """Evaluate every ``interval`` seconds while holding the evaluator lease; stand by
        and retry while another monitor holds it. Returns after ``stop``."""
        while not self._stop.is_set():
            lease = Lease(self.broker.lease_backend(), self.lease_key, ttl=self.lease_ttl)
            try:
                async with lease:
                    self._is_active = True
                    log.info(
                        "monitor %s is the active evaluator of queue %r", self.name, self.queue
                    )
                    await self._restore()
                    await self._evaluate_loop()
            except LeaseUnavailable:
                pass
            except LeaseLost as exc:
                log.warning("monitor %s lost the evaluator lease (%s); standing by", self.name, exc)
            except Exception as exc:
                log.warning("monitor %s could not take the evaluator lease (%r)", self.name, exc)
            finally:
                self._is_active = False
            await self._sleep(min(self.interval, self.lease_ttl / 3))

    def stop(self) -> None:
        """Ask ``run`` to return (it releases the lease first)."""
        self._stop.set()

    async def __aenter__(self) -> Monitor:
        self._stop.clear()
        self._task = asyncio.get_running_loop().create_task(self.run(), name="aqw-monitor")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # -- the loop --------------------------------------------------------------------------

    async def _evaluate_loop(self) -> None:
        while not self._stop.is_set():
            try:
                await self.evaluate_once()
            except Exception as exc:
                log.warning("monitor %s: evaluation failed (%r)", self.name, exc)
            await self._sleep(self.interval)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def _emit(self, alert: Alert) -> None:
        for sink in self.sinks:
            try:
                await sink.emit(dataclasses.replace(alert, details=dict(alert.details)))
            except Exception:
                log.exception("alert sink %r failed", sink)

    def _transition(self, now: float, firing: dict[str, Alert]) -> list[Alert]:
        changes: list[Alert] = []
        for key, alert in firing.items():
            current = self._active_alerts.get(key)
            if current is None:
                self._active_alerts[key] = alert
                changes.append(alert)
            else:
                current.summary, current.details = alert.summary, alert.details
        for key in [k for k in self._active_alerts if k not in firing]:
            gone = self._active_alerts.pop(key)
            gone.resolved_at = now
            changes.append(gone)
        return changes

    # -- the rules -------------------------------------------------------------------------

    def _check_depth(self, now: float, depth: int) -> list[Alert]:
        b = self._baseline
        if b.value is None:
            b.value, b.since, b.at = float(depth), now, now
            return []
        warm = now - b.since >= self.warmup
        threshold = b.value * self.depth_factor
        if warm and depth > threshold and depth >= self.depth_min:
            if b.above_since is None:
                b.above_since = now
        else:
            b.above_since = None
            weight = 1.0 - 0.5 ** (max(0.0, now - b.at) / self.baseline_halflife)
            b.value += weight * (depth - b.value)
        b.at = now
        if b.above_since is None or now - b.above_since < self.depth_for:
            return []
        summary = (
            f"queue {self.queue!r}: {depth} jobs waiting, more than "
            f"{self.depth_factor:g}x its baseline of {b.value:.1f} for "
            f"{now - b.above_since:.0f}s"
        )
        details = {
            "depth": depth,
            "baseline": b.value,
            "threshold": threshold,
            "above_since": b.above_since,
        }
        return [Alert("queue_depth", self.queue, "warning", summary, details, now)]

    def _check_retries(self, now: float, workers: list[dict[str, Any]]) -> list[Alert]:
        window = "last_5m" if self.retry_window == 300.0 else "last_1m"
        w = _Window()
        for beat in workers:
            counts = beat.get(window) or {}
            w.processed += int(counts.get("processed", 0))
            w.retried += int(counts.get("retried", 0))
            w.dead += int(counts.get("dead", 0))
        if w.processed + w.retried + w.dead < self.min_processed:
            return []
        rate = w.retried / w.processed if w.processed else math.inf
        if rate <= self.retry_rate:
            return []
        shown = "all" if math.isinf(rate) else f"{rate:.1%}"
        summary = (
            f"queue {self.queue!r}: retries at {shown} of processed jobs over "
            f"{self.retry_window:g}s ({w.retried} retried, {w.processed} processed), "
            f"above {self.retry_rate:.0%}"
        )
        details = {
            "processed": w.processed,
            "retried": w.retried,
            "dead": w.dead,
            "rate": None if math.isinf(rate) else rate,
            "window": self.retry_window,
            "workers": len(workers),
        }
        return [Alert("retry_rate", self.queue, "warning", summary, details, now)]

    def _sla(self, task: str) -> float | None:
        if self.app is None or task not in self.app.tasks:
            return None
        return self.app.tasks[task].options.sla

    def _check_stuck(
        self, now: float, workers: list[dict[str, Any]], states: list[dict[str, str]]
    ) -> list[Alert]:
        out: dict[str, Alert] = {}
        for beat in workers:
            for job in beat.get("stuck") or []:
                sla = float(job.get("sla") or 0)
                running_for = now - float(job.get("started_at", now))
                if sla <= 0 or running_for <= self.stuck_factor * sla:
                    continue
                summary = (
                    f"job {job['job_id']} ({job.get('task')}) on {job.get('worker')} "
                    f"has run {_secs(running_for)}, more than {self.stuck_factor:g}x its "
                    f"SLA of {sla:g}s"
                )
                details = {**job, "reason": "sla", "running_for": running_for}
                out[job["job_id"]] = self._stuck_alert(now, job["job_id"], summary, details)
        live = {str(b.get("worker")) for b in workers}
        for state in states:
            job_id, worker = state.get("job_id", ""), state.get("worker", "")
            if not job_id or job_id in out or worker in live:
                continue
            started = _float(state.get("started_at"), now)
            expires = _float(state.get("lease_expires_at"), math.inf)
            task_sla = self._sla(state.get("task", ""))
            expected = self.stuck_factor * task_sla if task_sla else self.orphan_after
            if expires > now and now - started <= expected:
                continue
            why = (
                "its lease expired" if expires <= now else f"it started {_secs(now - started)} ago"
            )
            summary = (
                f"job {job_id} ({state.get('task')}) is orphaned: worker {worker} no "
                f"longer heartbeats and {why}"
            )
            details = {**state, "reason": "orphaned", "running_for": now - started}
            out[job_id] = self._stuck_alert(now, job_id, summary, details)
        return self._cap_job_alerts(now, list(out.values()))

    def _cap_job_alerts(self, now: float, alerts: list[Alert]) -> list[Alert]:
        if len(alerts) <= self.max_job_alerts:
            return alerts
        alerts.sort(
            key=lambda a: (a.key not in self._active_alerts, now - a.details["running_for"])
        )
        kept, rest = alerts[: self.max_job_alerts], alerts[self.max_job_alerts :]
        summary = f"queue {self.queue!r}: {len(rest)} more stuck or orphaned jobs"
        details = {"count": len(rest), "job_ids": [a.details.get("job_id") for a in rest][:100]}
        return [*kept, self._stuck_alert(now, "more", summary, details)]

    def _stuck_alert(self, now: float, job_id: str, summary: str, details: dict[str, Any]) -> Alert:
        return Alert(
            "stuck_job", self.queue, "warning", summary, details, now, key=f"stuck_job:{job_id}"
        )

    # -- shared state ----------------------------------------------------------------------

    async def _publish(self, now: float) -> None:
        b = self._baseline
        data = {
            "kind": MONITOR_KIND,
            "monitor": self.name,
            "queue": self.queue,
            "at": now,
            "interval": self.interval,
            "alerts": [a.as_dict() for a in self.active_alerts()],
            "state": {
                "baseline": b.value,
                "since": b.since,
                "at": b.at,
                "above_since": b.above_since,
            },
        }
        ttl = max(3 * self.interval, 2 * self.lease_ttl)
        await self.broker.publish_heartbeat(self.heartbeat_name, data, ttl=ttl)

    async def _restore(self) -> None:
        """Take over the state the previous active monitor published, if newer than ours."""
        try:
            beats = await self.broker.heartbeats()
        except Exception as exc:
            log.warning("monitor %s: could not read the previous state (%r)", self.name, exc)
            return
        mine = [b for b in beats if is_monitor_heartbeat(b) and b.get("queue") == self.queue]
        if not mine:
            return
        last = max(mine, key=lambda b: float(b.get("at", 0)))
        if self._last_at is not None and float(last.get("at", 0)) <= self._last_at:
            return
        state = last.get("state") or {}
        if state.get("baseline") is not None:
            self._baseline = _Baseline(
                float(state["baseline"]),
                float(state["since"]),
                float(state["at"]),
                state.get("above_since"),
            )
        alerts = [Alert.from_dict(a) for a in last.get("alerts") or []]
        self._active_alerts = {a.key: a for a in alerts}
        log.info(
            "monitor %s restored the state of %s (%d active alerts)",
            self.name,
            last.get("monitor"),
            len(alerts),
        )


def _secs(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


def _float(value: str | None, default: float) -> float:
    try:
        return float(value) if value is not None else default
    except ValueError:
        return default


# -- `aqw monitor` --------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """Add ``aqw monitor`` to the command line's subparsers."""
    from .cli import _add_target

    p = sub.add_parser("monitor", help="evaluate the alert rules of a queue until stopped")
    _add_target(p, positional_app=False)
    p.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help="POST alert transitions as JSON to URL (repeatable)",
    )
    p.add_argument("--interval", type=float, default=15.0, help="seconds between evaluations")


async def run(args: argparse.Namespace) -> int:
    """``aqw monitor``: run a ``Monitor`` until SIGTERM or SIGINT."""
    from .cli import resolve_app

    app = resolve_app(args, need_app=False)
    otel = _configure_otel()
    sinks: list[Sink] = [LogSink(), *(WebhookSink(url) for url in args.webhook)]
    monitor = Monitor(app, sinks=sinks, interval=args.interval)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with monitor:
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await app.close()
        if otel:
            _call_telemetry("shutdown_otel")
    return 0


def _configure_otel() -> bool:
    return bool(_call_telemetry("configure_otel", service_name="aqw-monitor"))


def _call_telemetry(name: str, **kwargs: Any) -> Any:
    """Call ``aqw.telemetry.<name>`` when that module and function exist."""
    try:
        telemetry = importlib.import_module("aqw.telemetry")
    except ImportError:
        return None
    fn = getattr(telemetry, name, None)
    return fn(**kwargs) if callable(fn) else None
