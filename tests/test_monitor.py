"""The monitor: the three alert rules at their thresholds (with an injected clock), firing and
resolving, one active evaluator per queue with failover, the sinks, and ``aqw monitor``.

Rule tests drive a :class:`~aqw.brokers.memory.MemoryBroker` directly: the depth by publishing
and settling jobs, the worker side by publishing synthetic heartbeats and job states.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import REDIS_URL, Backend

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from aqw.cli._monitor import add_parser
from aqw.job import Job
from aqw.lease import Lease
from aqw.monitor import Alert, CallbackSink, LogSink, Monitor, WebhookSink
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000.0
HOUR = 3600.0


class Clock:
    """An injected wall clock."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def set_waiting(broker: MemoryBroker, n: int) -> None:
    """Move the broker's waiting depth to ``n`` by publishing or fetching and acking jobs."""
    current = (await broker.depth()).waiting
    if n > current:
        await broker.publish([Job(task="t") for _ in range(n - current)])
    elif n < current:
        for delivery in await broker.fetch(current - n, block=0):
            assert await broker.ack(delivery, None, None)
    assert (await broker.depth()).waiting == n


def beat(worker: str, **fields: Any) -> dict[str, Any]:
    """A worker heartbeat shaped like ``Worker.summary()``."""
    data: dict[str, Any] = {
        "worker": worker,
        "queue": "q",
        "pid": 1,
        "state": "running",
        "at": T0,
        "started_at": T0,
        "concurrency": 10,
        "in_flight": 0,
        "leases": 0,
        "totals": {},
        "last_1m": {},
        "last_5m": {},
        "duration_5m": {"p50": 0.0, "p99": 0.0},
        "running": [],
        "stuck": [],
        "errors": [],
        "runaway": [],
    }
    data.update(fields)
    return data


class Recorder:
    """A callback sink target: every transition, as (key, "firing" | "resolved")."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    def __call__(self, alert: Alert) -> None:
        self.alerts.append(alert)

    @property
    def events(self) -> list[tuple[str, str]]:
        return [(a.key, "firing" if a.active else "resolved") for a in self.alerts]


@pytest.fixture
def broker(queue_name: str) -> MemoryBroker:
    return MemoryBroker(queue_name)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def seen() -> Recorder:
    return Recorder()


def make_monitor(broker: aqw.Broker | aqw.App, clock: Clock, seen: Recorder, **kw: Any) -> Monitor:
    return Monitor(broker, sinks=[CallbackSink(seen)], clock=clock, **kw)


async def hold(monitor: Monitor, clock: Clock, seconds: float, step: float = 60.0) -> None:
    """Evaluate every ``step`` seconds of the injected clock for ``seconds`` more seconds."""
    end = clock.t + seconds
    while clock.t + step <= end:
        clock.t += step
        await monitor.evaluate_once()
    if clock.t < end:
        clock.t = end
        await monitor.evaluate_once()


async def warmed(broker: MemoryBroker, clock: Clock, seen: Recorder, depth: int = 100) -> Monitor:
    """A monitor whose baseline learned ``depth`` over its one-hour warm-up."""
    monitor = make_monitor(broker, clock, seen)
    await set_waiting(broker, depth)
    await monitor.evaluate_once()
    await hold(monitor, clock, HOUR)
    assert monitor.baseline == pytest.approx(depth)
    assert monitor.active_alerts() == [] and seen.alerts == []
    return monitor


# -- queue depth ---------------------------------------------------------------------------------


async def test_depth_49_percent_above_baseline_never_fires(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = await warmed(broker, clock, seen)
    await set_waiting(broker, 149)
    await hold(monitor, clock, 30 * 60)
    assert seen.alerts == []
    # below the threshold the baseline keeps learning: it moved towards 149
    assert 100 < (monitor.baseline or 0) < 149


async def test_depth_51_percent_above_fires_at_10_minutes_not_before_and_resolves(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = await warmed(broker, clock, seen)
    await set_waiting(broker, 151)
    rose = clock.t + 1
    clock.t = rose
    await monitor.evaluate_once()
    await hold(monitor, clock, 599, step=30)  # 9 min 59 s above
    assert clock.t == rose + 599
    assert seen.alerts == [] and monitor.active_alerts() == []
    assert monitor.baseline == pytest.approx(100)  # learning frozen while above

    clock.t = rose + 600
    fired = await monitor.evaluate_once()
    assert [a.rule for a in fired] == ["queue_depth"]
    alert = fired[0]
    assert alert.queue == broker.queue and alert.severity == "warning"
    assert alert.fired_at == rose + 600 and alert.resolved_at is None
    assert alert.details["depth"] == 151 and alert.details["baseline"] == pytest.approx(100)
    assert alert.details["above_since"] == rose
    assert "151 jobs waiting" in alert.summary
    assert [a.key for a in monitor.active_alerts()] == ["queue_depth"]
    assert seen.events == [("queue_depth", "firing")]

    await hold(monitor, clock, 300)  # still above: no new transition, still frozen
    assert seen.events == [("queue_depth", "firing")]
    assert monitor.baseline == pytest.approx(100)

    await set_waiting(broker, 100)
    clock.t += 15
    resolved = await monitor.evaluate_once()
    assert [(a.rule, a.resolved_at) for a in resolved] == [("queue_depth", clock.t)]
    assert seen.events == [("queue_depth", "firing"), ("queue_depth", "resolved")]
    assert seen.alerts[-1].fired_at == rose + 600
    assert monitor.active_alerts() == []


async def test_depth_dip_below_threshold_restarts_the_10_minutes(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = await warmed(broker, clock, seen)
    await set_waiting(broker, 151)
    await hold(monitor, clock, 540)
    await set_waiting(broker, 120)
    await hold(monitor, clock, 60)
    await set_waiting(broker, 151)
    await hold(monitor, clock, 1)  # above again from here
    await hold(monitor, clock, 599, step=30)  # 18 of the last 20 minutes above, not 10 in a row
    assert seen.alerts == []
    await hold(monitor, clock, 1)
    assert seen.events == [("queue_depth", "firing")]


async def test_depth_needs_warmup_and_a_minimum_depth(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen)
    await set_waiting(broker, 10)
    await monitor.evaluate_once()
    await hold(monitor, clock, 20 * 60)
    await set_waiting(broker, 100)  # 10x, but the baseline has only 20 minutes of history
    await hold(monitor, clock, 30 * 60)
    assert seen.alerts == []

    quiet = MemoryBroker(broker.queue + "-idle")
    idle = make_monitor(quiet, clock, seen)
    await set_waiting(quiet, 2)
    await idle.evaluate_once()
    await hold(idle, clock, HOUR)
    await set_waiting(quiet, 6)  # 3x a baseline of 2, but under depth_min=10
    await hold(idle, clock, HOUR)
    assert seen.alerts == []


async def test_baseline_is_a_time_weighted_ewma(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = await warmed(broker, clock, seen)
    await set_waiting(broker, 120)  # 20% above: learned
    await hold(monitor, clock, HOUR, step=45)  # one half-life, in irregular-looking steps
    assert monitor.baseline == pytest.approx(110)
    await hold(monitor, clock, HOUR, step=600)
    assert monitor.baseline == pytest.approx(115)
    assert seen.alerts == []


# -- retry rate ----------------------------------------------------------------------------------


async def publish_windows(broker: aqw.Broker, *windows: tuple[int, int, int]) -> None:
    for i, (processed, retried, dead) in enumerate(windows):
        counts = {"processed": processed, "retried": retried, "dead": dead, "failed": retried}
        await broker.status.publish_heartbeat(f"w{i}", beat(f"w{i}", last_5m=counts), ttl=60)


async def test_retry_rate_exactly_5_percent_is_quiet_just_above_fires_and_resolves(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen)
    await publish_windows(broker, (60, 3, 0), (40, 2, 0))  # 5 / 100 = exactly 5%
    assert await monitor.evaluate_once() == []

    await publish_windows(broker, (60, 3, 0), (40, 3, 0))  # 6 / 100
    clock.t += 15
    fired = await monitor.evaluate_once()
    assert [a.rule for a in fired] == ["retry_rate"]
    details = fired[0].details
    assert (details["processed"], details["retried"], details["workers"]) == (100, 6, 2)
    assert details["rate"] == pytest.approx(0.06)
    assert "6.0%" in fired[0].summary

    clock.t += 15
    assert await monitor.evaluate_once() == []  # still firing: no new transition
    await publish_windows(broker, (60, 3, 0), (40, 2, 0))
    clock.t += 15
    resolved = await monitor.evaluate_once()
    assert [(a.rule, a.resolved_at) for a in resolved] == [("retry_rate", clock.t)]
    assert seen.events == [("retry_rate", "firing"), ("retry_rate", "resolved")]


async def test_retry_rate_needs_min_processed_and_fires_when_nothing_succeeds(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen)
    await publish_windows(broker, (10, 5, 4))  # 19 settled jobs < min_processed=20
    assert await monitor.evaluate_once() == []
    await publish_windows(broker, (0, 25, 0))  # everything retries: the worst case
    fired = await monitor.evaluate_once()
    assert [a.rule for a in fired] == ["retry_rate"]
    assert fired[0].details["rate"] is None and "at all of processed" in fired[0].summary


async def test_monitor_heartbeat_does_not_count_as_a_worker(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen)
    await publish_windows(broker, (100, 20, 0))
    await monitor.evaluate_once()  # fires, and publishes the monitor heartbeat
    beats = await broker.status.heartbeats()
    mon = [b for b in beats if b.get("kind") == "monitor"]
    assert len(mon) == 1 and mon[0]["monitor"] == monitor.name
    assert [a["rule"] for a in mon[0]["alerts"]] == ["retry_rate"]
    clock.t += 15
    assert await monitor.evaluate_once() == []
    assert monitor.active_alerts()[0].details["workers"] == 1


# -- stuck and orphaned jobs ---------------------------------------------------------------------


def stuck_entry(job_id: str, clock: Clock, running_for: float, sla: float = 100) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "task": "slow",
        "sla": sla,
        "started_at": clock.t - running_for,
        "running_for": running_for,
        "worker": "w0",
    }


async def test_stuck_job_fires_and_resolves_when_it_finishes(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen)
    await broker.status.publish_heartbeat(
        "w0", beat("w0", stuck=[stuck_entry("j1", clock, 201)]), 60
    )
    fired = await monitor.evaluate_once()
    assert [(a.rule, a.key) for a in fired] == [("stuck_job", "stuck_job:j1")]
    assert fired[0].details["reason"] == "sla" and fired[0].details["worker"] == "w0"
    assert "2x its SLA of 100s" in fired[0].summary

    await broker.status.publish_heartbeat("w0", beat("w0", stuck=[]), 60)  # the job finished
    clock.t += 15
    resolved = await monitor.evaluate_once()
    assert [(a.key, a.resolved_at) for a in resolved] == [("stuck_job:j1", clock.t)]
    assert seen.events == [("stuck_job:j1", "firing"), ("stuck_job:j1", "resolved")]


async def test_stuck_factor_is_applied_to_the_workers_reports(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen, stuck_factor=3.0)
    await broker.status.publish_heartbeat(
        "w0", beat("w0", stuck=[stuck_entry("j1", clock, 250)]), 60
    )
    assert await monitor.evaluate_once() == []
    clock.t += 51  # now 301 s: past 3x the SLA
    assert [a.key for a in await monitor.evaluate_once()] == ["stuck_job:j1"]


async def test_many_stuck_jobs_are_capped_into_one_more_alert(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen, max_job_alerts=3)
    first = [stuck_entry(f"j{i}", clock, 300 + i) for i in range(2)]
    await broker.status.publish_heartbeat("w0", beat("w0", stuck=first), 60)
    await monitor.evaluate_once()
    many = first + [stuck_entry(f"k{i}", clock, 1000 + i) for i in range(5)]
    await broker.status.publish_heartbeat("w0", beat("w0", stuck=many), 60)
    fired = await monitor.evaluate_once()
    # the two already firing stay; the oldest new one gets the last slot; four are counted
    assert sorted(a.key for a in monitor.active_alerts()) == [
        "stuck_job:j0",
        "stuck_job:j1",
        "stuck_job:k4",
        "stuck_job:more",
    ]
    more = next(a for a in fired if a.key == "stuck_job:more")
    assert more.details["count"] == 4 and "4 more stuck" in more.summary
    assert sorted(more.details["job_ids"]) == ["k0", "k1", "k2", "k3"]


def running_job(
    broker: aqw.Broker, job_id: str, worker: str, started_at: float, lease_expires_at: float
) -> None:
    """Record job ``job_id`` of task ``slow`` as running on ``worker`` since ``started_at``
    under a lease confirmed until ``lease_expires_at`` (the monitor's clock is fake)."""
    job = aqw.Job(id=job_id, task="slow")
    broker.records.enqueued(job)
    broker.records.started(job, worker, 1, lease_expires_at, started_at=started_at)


def end_job(broker: aqw.Broker, job_id: str) -> None:
    broker.records.finish(aqw.Job(id=job_id, task="slow"), "succeeded", {}, 60)


async def test_orphaned_job_of_a_dead_worker_fires_and_resolves(
    broker: MemoryBroker, clock: Clock, seen: Recorder
) -> None:
    monitor = make_monitor(broker, clock, seen, orphan_after=300)
    now = clock.t
    await broker.status.publish_heartbeat("alive", beat("alive"), ttl=60)
    running_job(broker, "expired", "gone", now - 5, now - 1)
    running_job(broker, "young", "gone", now - 5, now + 20)
    running_job(broker, "live", "alive", now - 999, now - 1)
    fired = await monitor.evaluate_once()
    assert [a.key for a in fired] == ["stuck_job:expired"]
    assert fired[0].details["reason"] == "orphaned"
    assert "worker gone no longer heartbeats and its lease expired" in fired[0].summary

    clock.t = now + 301  # "young" is now older than orphan_after, its worker still gone
    assert [a.key for a in await monitor.evaluate_once()] == ["stuck_job:young"]

    end_job(broker, "expired")
    end_job(broker, "young")
    clock.t += 15
    resolved = await monitor.evaluate_once()
    assert sorted(a.key for a in resolved) == ["stuck_job:expired", "stuck_job:young"]
    assert all(a.resolved_at == clock.t for a in resolved)
    assert monitor.active_alerts() == []


async def test_orphan_uses_the_tasks_sla_when_given_the_app(
    queue_name: str, clock: Clock, seen: Recorder
) -> None:
    app = aqw.App(MemoryBroker(queue_name))

    @app.task(name="slow", sla=10.0)
    async def slow() -> None:
        return None

    monitor = make_monitor(app, clock, seen)
    now = clock.t
    running_job(app.broker, "a", "gone", now - 19, now + 20)
    running_job(app.broker, "b", "gone", now - 21, now + 20)
    assert [a.key for a in await monitor.evaluate_once()] == ["stuck_job:b"]


# -- sinks ---------------------------------------------------------------------------------------


async def test_sinks_get_each_transition_and_a_failing_sink_harms_no_one(
    broker: MemoryBroker, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[tuple[str, bool]] = []

    async def async_fn(alert: Alert) -> None:
        await asyncio.sleep(0)
        got.append((alert.key, alert.active))

    def broken(alert: Alert) -> None:
        raise RuntimeError("sink is down")

    sinks = [CallbackSink(broken), CallbackSink(async_fn), LogSink()]
    monitor = Monitor(broker, sinks=sinks, clock=clock)
    await publish_windows(broker, (100, 10, 0))
    with caplog.at_level("INFO", logger="aqw.monitor"):
        await monitor.evaluate_once()
        await publish_windows(broker, (100, 1, 0))
        await monitor.evaluate_once()
    assert got == [("retry_rate", True), ("retry_rate", False)]
    assert "ALERT retry_rate [warning]" in caplog.text
    assert "RESOLVED retry_rate" in caplog.text
    assert "sink is down" in caplog.text


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.received.append(  # type: ignore[attr-defined]
            {"body": json.loads(body), "type": self.headers["content-type"]}
        )
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A tiny HTTP server on 127.0.0.1 recording POSTed JSON: (url, received)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    received: list[dict[str, Any]] = []
    server.received = received  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("client", ["httpx", "urllib"])
async def test_webhook_sink_posts_firing_and_resolved(
    client: str,
    broker: MemoryBroker,
    clock: Clock,
    webhook: tuple[str, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if client == "urllib":
        monkeypatch.setitem(sys.modules, "httpx", None)  # `import httpx` now fails
    url, received = webhook
    sink = WebhookSink(url, timeout=2.0)
    monitor = Monitor(broker, sinks=[sink], clock=clock)
    await broker.status.publish_heartbeat(
        "w0", beat("w0", stuck=[stuck_entry("j9", clock, 500)]), 60
    )
    await monitor.evaluate_once()
    await broker.status.publish_heartbeat("w0", beat("w0"), 60)
    clock.t += 15
    await monitor.evaluate_once()
    assert (sink.sent, sink.failures) == (2, 0)
    assert [r["body"]["status"] for r in received] == ["firing", "resolved"]
    assert all(r["type"] == "application/json" for r in received)
    alert = received[0]["body"]["alert"]
    assert (alert["rule"], alert["key"]) == ("stuck_job", "stuck_job:j9")
    assert alert["queue"] == broker.queue
    assert alert["details"]["job_id"] == "j9" and alert["resolved_at"] is None
    assert received[1]["body"]["alert"]["resolved_at"] == clock.t


async def test_webhook_sink_failure_is_counted_not_raised(broker: MemoryBroker) -> None:
    from conftest import free_port

    sink = WebhookSink(f"http://127.0.0.1:{free_port()}/nobody", timeout=1.0)
    alert = Alert("retry_rate", broker.queue, "warning", "s", {}, T0)
    await sink.emit(alert)
    assert (sink.sent, sink.failures) == (0, 1)
    with pytest.raises(aqw.ConfigError):
        WebhookSink("ftp://example.com/")


# -- one active evaluator per queue --------------------------------------------------------------


def count_active(monitors: list[Monitor]) -> int:
    return sum(m.is_active for m in monitors)


async def watch_at_most_one(monitors: list[Monitor], seconds: float) -> set[str]:
    """Sample for ``seconds``; assert never more than one active; the names seen active."""
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert count_active(monitors) <= 1
        seen |= {m.name for m in monitors if m.is_active}
        await asyncio.sleep(0.005)
    return seen


@contextlib.asynccontextmanager
async def running(monitors: list[Monitor]) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for m in monitors:
            await stack.enter_async_context(m)
        yield


async def test_one_active_evaluator_across_three_monitors_and_failover(backend: Backend) -> None:
    # A lease far longer than the wait for a takeover: only a released lease is taken over.
    monitors = [
        Monitor(backend.app(), sinks=[], interval=0.05, lease_ttl=60, name=f"m{i}")
        for i in range(3)
    ]
    async with running(monitors):
        await eventually(lambda: count_active(monitors) == 1, 5, "one active monitor")
        assert len(await watch_at_most_one(monitors, 0.8)) == 1  # no flapping either
        first = next(m for m in monitors if m.is_active)
        await eventually(lambda: first.evaluations >= 3, 5, "evaluations")
        assert sum(m.evaluations for m in monitors if m is not first) == 0

        await first.__aexit__(None, None, None)  # a clean stop releases the lease at once
        rest = [m for m in monitors if m is not first]
        await eventually(lambda: count_active(rest) == 1, 20, "a standby to take over")
        assert not first.is_active
        second = next(m for m in rest if m.is_active)
        await eventually(lambda: second.evaluations >= 1, 5, "the new evaluator to evaluate")
        assert len(await watch_at_most_one(rest, 0.5)) == 1


async def test_a_dead_holders_lease_expires_and_a_standby_takes_over(backend: Backend) -> None:
    app = backend.app()
    # A monitor that died holding the lease: acquired, never renewed, never released.
    ttl = 1.5  # the standbys' first tries come well within it, however loaded the machine
    died = time.monotonic()
    dead = Lease(app.broker.lease_backend(), f"aqw:{{{app.queue}}}:monitor", ttl=ttl)
    await dead.acquire()
    monitors = [Monitor(backend.app(), sinks=[], interval=0.05, lease_ttl=ttl) for _ in range(2)]
    async with running(monitors):
        await asyncio.sleep(0.2)
        assert count_active(monitors) == 0
        await eventually(lambda: count_active(monitors) == 1, 10, "takeover after expiry")
        assert time.monotonic() - died >= ttl  # not before the dead holder's lease expired
        assert len(await watch_at_most_one(monitors, 0.5)) == 1


async def test_a_monitor_that_loses_its_lease_stands_by_and_comes_back(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend.app()
    monitor = Monitor(app, sinks=[], interval=0.05, lease_ttl=0.6)
    key = f"aqw:{{{app.queue}}}:monitor"
    with caplog.at_level("INFO", logger="aqw.monitor"):
        async with monitor:
            await eventually(lambda: monitor.is_active, 5, "the monitor to take the lease")
            if backend.raw is None:  # an operator deleting the key by hand
                app.broker.lease_backend()._held.pop(key)  # type: ignore[attr-defined]
            else:
                await backend.raw.delete(key)
            await eventually(lambda: not monitor.is_active, 5, "the lease to be lost")
            await eventually(lambda: monitor.is_active, 5, "the lease to be taken again")
    assert "lost the evaluator lease" in caplog.text
    assert not monitor.is_active


async def test_takeover_restores_alerts_and_baseline_without_refiring(
    broker: MemoryBroker, seen: Recorder
) -> None:
    await publish_windows(broker, (100, 30, 0))
    await set_waiting(broker, 40)
    first_seen = Recorder()
    first = Monitor(broker, sinks=[CallbackSink(first_seen)], interval=0.05, lease_ttl=0.6)
    async with first:
        await eventually(lambda: first_seen.events == [("retry_rate", "firing")], 5, "firing")
        await eventually(lambda: first.evaluations >= 2, 5, "a few evaluations")
    fired_at = first.active_alerts()[0].fired_at

    second = Monitor(broker, sinks=[CallbackSink(seen)], interval=0.05, lease_ttl=0.6)
    async with second:
        await eventually(lambda: second.evaluations >= 2, 5, "the second monitor evaluating")
        assert [(a.key, a.fired_at) for a in second.active_alerts()] == [("retry_rate", fired_at)]
        assert second.baseline == pytest.approx(40)
        assert seen.events == []  # restored, not fired again
        await publish_windows(broker, (100, 0, 0))
        await eventually(lambda: seen.events == [("retry_rate", "resolved")], 5, "resolution")
    assert seen.alerts[0].fired_at == fired_at


# -- aqw monitor ---------------------------------------------------------------------------------


def test_add_parser_builds_the_monitor_command() -> None:
    parser = argparse.ArgumentParser(prog="aqw")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "monitor",
            "--broker",
            "memory://",
            "--queue",
            "q",
            "--webhook",
            "http://a/",
            "--webhook",
            "http://b/",
            "--interval",
            "2",
        ]
    )
    assert (args.command, args.broker, args.queue) == ("monitor", "memory://", "q")
    assert (args.webhook, args.interval) == (["http://a/", "http://b/"], 2.0)


CLI = """
import argparse, asyncio, sys
from aqw.cli._monitor import add_parser, run
parser = argparse.ArgumentParser(prog="aqw")
add_parser(parser.add_subparsers(dest="command"))
sys.exit(asyncio.run(run(parser.parse_args(sys.argv[1:]))))
"""


@pytest.mark.redis
async def test_aqw_monitor_runs_until_sigterm_and_posts_to_the_webhook(
    queue_name: str,
    webhook: tuple[str, list[dict[str, Any]]],
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    url, received = webhook
    broker = RedisBroker(REDIS_URL, queue_name)
    try:
        await publish_windows(broker, (50, 10, 0))
        proc = await asyncio.to_thread(
            subprocess.Popen,
            [
                sys.executable,
                "-c",
                CLI,
                "monitor",
                "--broker",
                REDIS_URL,
                "--queue",
                queue_name,
                "--interval",
                "0.1",
                "--webhook",
                url,
            ],
            env=subprocess_env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            await eventually(lambda: len(received) >= 1, 20, "the webhook POST")
            assert received[0]["body"]["status"] == "firing"
            assert received[0]["body"]["alert"]["rule"] == "retry_rate"
            beats = await broker.status.heartbeats()
            assert [b["alerts"][0]["rule"] for b in beats if b.get("kind") == "monitor"] == [
                "retry_rate"
            ]
            assert await broker.client.exists(f"aqw:{{{queue_name}}}:monitor") == 1
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.to_thread(proc.communicate, timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        assert proc.returncode == 0, out.decode()
        assert b"ALERT retry_rate" in out
        assert await broker.client.exists(f"aqw:{{{queue_name}}}:monitor") == 0  # released
    finally:
        await broker.close()


# -- the Prometheus rules shipped in docs --------------------------------------------------------


def prometheus_names() -> set[str]:
    """Every series name an OTel -> Prometheus exporter renders from aqw's metrics."""
    from aqw.telemetry import METRICS

    names: set[str] = set()
    for name, (kind, unit, _) in METRICS.items():
        base = name.replace(".", "_") + {"s": "_seconds"}.get(unit, "")
        if kind == "counter":
            names.add(base + "_total")
        elif kind == "histogram":
            names |= {base + "_bucket", base + "_sum", base + "_count"}
        else:
            names.add(base)
    return names


def test_prometheus_rules_parse_and_name_real_metrics(repo_root: Path) -> None:
    import re

    import yaml

    doc = yaml.safe_load((repo_root / "docs/alerts/prometheus-rules.yml").read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    recorded = {r["record"] for r in rules if "record" in r}
    assert set(alerts) >= {"AqwQueueDepthAboveBaseline", "AqwRetryRateHigh", "AqwJobStuck"}
    assert {r["labels"]["rule"] for r in alerts.values()} == {
        "queue_depth",
        "retry_rate",
        "stuck_job",
    }
    assert alerts["AqwQueueDepthAboveBaseline"]["for"] == "10m"
    assert "1.5 * aqw:queue_depth:baseline_1d" in alerts["AqwQueueDepthAboveBaseline"]["expr"]
    retry = alerts["AqwRetryRateHigh"]["expr"]
    assert "rate(aqw_jobs_retried_total[5m])" in retry and "> 0.05" in retry
    assert "rate(aqw_jobs_processed_total[5m])" in retry and ">= 20" in retry
    assert "aqw_jobs_stuck_total" in alerts["AqwJobStuck"]["expr"]

    known = prometheus_names()
    for rule in rules:
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), rule
        for series in set(re.findall(r"\baqw_[a-z_]+", expr)) - {"aqw_task"}:  # a label
            assert series in known, f"{series} is not a metric aqw exports"
        for record in re.findall(r"\baqw:[a-z_0-9:]+", expr):
            assert record in recorded, f"{record} is not recorded"
        for key in rule.get("labels", {}):
            assert re.fullmatch(r"[a-z_]+", key)
