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

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._ids import consumer_name
from .._readback import split_heartbeats, to_float
from .._text import printable
from ..brokers.base import Broker
from ..errors import BrokerUnavailable, ConfigError, LeaseLost, LeaseUnavailable
from ..lease import Lease
from ._rules import Baseline, check_depth, check_retries, check_stuck
from ._sinks import Alert, LogSink, Sink

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("aqw.monitor")

#: ``kind`` of the heartbeat a monitor publishes (not a worker's).
MONITOR_KIND = "monitor"


def is_monitor_heartbeat(beat: dict[str, Any]) -> bool:
    """True for the heartbeat a ``Monitor`` publishes, False for a worker's."""
    return isinstance(beat, dict) and beat.get("kind") == MONITOR_KIND


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
        give_up_after: seconds without an answer from the broker (since ``run`` started,
            or since its last answer) after which ``run`` raises ``BrokerUnavailable``
            (default ``None``: retry forever).

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
        give_up_after: float | None = None,
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
        if give_up_after is not None and give_up_after <= 0:
            raise ConfigError(f"Monitor give_up_after must be > 0 seconds, got {give_up_after!r}")
        self.give_up_after = give_up_after
        self._answered_at = 0.0  # time.monotonic() of the broker's last answer
        self._baseline = Baseline()
        self._active_alerts: dict[str, Alert] = {}
        self._is_active = False
        self._connected = False
        self._last_at: float | None = None
        self._damage_seen: list[str] = []
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
        beats, damage = split_heartbeats(await self.broker.status.heartbeats())
        if damage != self._damage_seen:  # said once, not every interval
            for note in damage:
                log.warning("monitor %s: %s (left out)", self.name, printable(note))
            self._damage_seen = damage
        workers = [b for b in beats if not is_monitor_heartbeat(b)]
        states = await self.broker.records.running_states()
        firing: dict[str, Alert] = {}
        for alert in (
            *check_depth(self, self._baseline, now, depth.waiting),
            *check_retries(self, now, workers),
            *check_stuck(self, now, workers, states, self._active_alerts),
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
        and retry while another monitor holds it. Returns after ``stop``; raises
        ``BrokerUnavailable`` when the broker has not answered for ``give_up_after`` s."""
        self._answered_at = time.monotonic()
        while not self._stop.is_set():
            lease = Lease(self.broker.lease_backend(), self.lease_key, ttl=self.lease_ttl)
            pause = min(self.interval, self.lease_ttl / 3)
            try:
                async with lease:
                    self._answered_at = time.monotonic()
                    self._is_active = True
                    log.info(
                        "monitor %s is the active evaluator of queue %r", self.name, self.queue
                    )
                    await self._restore()
                    await self._evaluate_loop()
            except LeaseUnavailable:
                self._answered_at = time.monotonic()
            except LeaseLost as exc:
                log.warning("monitor %s lost the evaluator lease (%s); standing by", self.name, exc)
            except BrokerUnavailable:
                raise
            except Exception as exc:
                pause = self._unanswered(exc, pause)
                log.warning("monitor %s could not take the evaluator lease (%r)", self.name, exc)
            finally:
                self._is_active = False
            await self._sleep(pause)

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
            pause = self.interval
            try:
                await self.evaluate_once()
                self._answered_at = time.monotonic()
            except Exception as exc:
                pause = self._unanswered(exc, pause)
                log.warning("monitor %s: evaluation failed (%r)", self.name, exc)
            await self._sleep(pause)

    def _unanswered(self, exc: Exception, pause: float) -> float:
        """A broker call failed: raise ``BrokerUnavailable`` once the broker has not
        answered for ``give_up_after`` seconds, else the pause before the next try (cut
        short so the giving up happens on time)."""
        if self.give_up_after is None:
            return pause
        silent = time.monotonic() - self._answered_at
        if silent >= self.give_up_after:
            raise BrokerUnavailable(
                f"cannot reach the broker {self.broker.describe()}: no answer for "
                f"{silent:.0f}s, giving up (--give-up-after {self.give_up_after:g}s; last "
                f"error: {printable(str(exc)) or type(exc).__name__})"
            ) from exc
        return min(pause, max(0.1, self.give_up_after - silent))

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
        await self.broker.status.publish_heartbeat(self.heartbeat_name, data, ttl=ttl)
        if self.broker.history is not None:  # the queue's depth sample of this bucket
            await self.broker.history.sample(time.time())

    async def _restore(self) -> None:
        """Take over the state the previous active monitor published, if newer than ours."""
        try:
            beats = await self.broker.status.heartbeats()
        except Exception as exc:
            log.warning("monitor %s: could not read the previous state (%r)", self.name, exc)
            return
        # A damaged monitor heartbeat is ignored: starting afresh beats never evaluating.
        beats, _ = split_heartbeats(beats)
        mine = [b for b in beats if is_monitor_heartbeat(b) and b.get("queue") == self.queue]
        if not mine:
            return
        last = max(mine, key=lambda b: to_float(b.get("at"), 0.0))
        if self._last_at is not None and to_float(last.get("at"), 0.0) <= self._last_at:
            return
        state = last.get("state") or {}
        baseline = to_float(state.get("baseline"), None)
        since, at = to_float(state.get("since"), None), to_float(state.get("at"), None)
        if baseline is not None and since is not None and at is not None:
            self._baseline = Baseline(baseline, since, at, to_float(state.get("above_since"), None))
        try:
            alerts = [Alert.from_dict(a) for a in last.get("alerts") or []]
        except (TypeError, ValueError) as exc:
            log.warning("monitor %s: the published alerts are damaged (%r)", self.name, exc)
            alerts = []
        self._active_alerts = {a.key: a for a in alerts}
        log.info(
            "monitor %s restored the state of %s (%d active alerts)",
            self.name,
            last.get("monitor"),
            len(alerts),
        )
