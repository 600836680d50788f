"""The autoscaling signal (issue 28): ``desired_workers`` from depth, delays due within the
horizon, arrival and service rates and the rate-limit ceiling, against hand-computed
values; summed over priority levels and partitions; in ``aqw status --json`` and as the
``aqw.queue.desired_workers`` gauge."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.brokers.redis import PartitionedBroker
from aqw.flow import flow_control
from aqw.scaling import ScalingInputs, desired_workers, rate_ceiling, scaling_inputs
from aqw.status import gather_status
from tests._helpers import REDIS_URL, eventually, require_real_redis, running
from tests.test_telemetry import Otel, base_attrs, otel  # noqa: F401 - the fixture, by name

pytestmark = pytest.mark.timeout(60)


def inputs(**values: Any) -> ScalingInputs:
    base: dict[str, Any] = dict(
        ready=0, leased=0, due=0, arrivals=0.0, service=None, concurrency=10, ceiling=None
    )
    return ScalingInputs(**{**base, **values})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, 0),  # nothing waits, runs or arrives: scale to zero
        ({"ready": 150, "leased": 50, "due": 30, "concurrency": 100}, 3),  # 230 / 100
        ({"ready": 1}, 1),
        # 20 running + 40/s x 0.5 s + 600 x 0.5 s / 60 s = 20 + 20 + 5 = 45 slots -> 5 of 10
        ({"ready": 600, "leased": 20, "arrivals": 40.0, "service": 0.5}, 5),
        # a 10/s limit: 10 x 0.5 = 5 slots help, whatever the backlog
        ({"ready": 600, "leased": 20, "arrivals": 40.0, "service": 0.5, "ceiling": 10.0}, 1),
        # steady state only: 100/s x 0.2 s = 20 slots -> 2
        ({"arrivals": 100.0, "service": 0.2}, 2),
        ({"arrivals": 100.0, "service": 0.2, "concurrency": 7}, 3),  # 20 / 7
    ],
)
def test_desired_workers_against_hand_computed_values(
    values: dict[str, Any], expected: int
) -> None:
    assert desired_workers(inputs(**values)) == expected


def test_the_rate_ceiling_needs_a_task_wide_limit_on_every_task() -> None:
    a = flow_control("a", rate_limit="10/s")
    b = flow_control("b", rate_limit="120/min")
    keyed = flow_control("c", rate_limit="5/s", rate_key=lambda p: p)
    plain = flow_control("d")
    assert rate_ceiling([a, b], {}, ["a", "b"]) == 12.0
    assert rate_ceiling([a, b], {"rate:a": "1/s"}, ["a", "b"]) == 3.0  # changed at run time
    assert rate_ceiling([a, keyed], {}, ["a", "c"]) is None
    assert rate_ceiling([a, plain], {}, ["a", "d"]) is None


async def _fill(app: aqw.App) -> None:
    @app.task(name="job")
    async def job(n: int) -> None: ...

    for level in (0, 4, 9):  # 3 x 40 ready on three priority levels
        await job.enqueue_many(list(range(40)), priority=level)
    await job.enqueue_many(list(range(30)), delay=30)  # due within the horizon
    await job.enqueue_many(list(range(10)), delay=3600)  # not


async def test_status_sums_levels_and_counts_delays_due_within_the_horizon(
    backend: Backend,
) -> None:
    app = backend.app()
    await _fill(app)
    status = await gather_status(app)
    assert status["scaling"]["ready"] == 120 and status["scaling"]["due"] == 30
    assert status["scaling"]["service"] is None  # no worker has run: one slot per job
    assert status["desired_workers"] == 2  # (120 + 30) / 100


async def test_a_partitioned_queue_sums_its_partitions(queue_name: str) -> None:
    require_real_redis()
    app = aqw.App(PartitionedBroker(REDIS_URL, queue_name, 3))
    try:
        await _fill(app)
        status = await gather_status(app)
    finally:
        await app.close()
    assert (status["scaling"]["ready"], status["scaling"]["due"]) == (120, 30)
    assert status["desired_workers"] == 2


async def test_heartbeats_give_the_service_time_and_arrivals(backend: Backend) -> None:
    app = backend.app()
    beat = {
        "worker": "w1",
        "concurrency": 20,
        "last_1m": {"processed": 1200},  # 20 jobs/s completed
        "duration_5m": {"p50": 0.25, "p99": 1.0},
    }
    monitor = {"kind": "monitor", "concurrency": 1}
    depth = await app.broker.depth()
    got = await scaling_inputs(app.broker, depth, [beat, monitor], None, time.time())
    assert (got.arrivals, got.service, got.concurrency) == (20.0, 0.25, 20)
    assert desired_workers(got) == 1  # 20/s x 0.25 s = 5 slots of 20


async def test_the_worker_exports_the_gauge(backend: Backend, otel: Otel) -> None:  # noqa: F811
    app = backend.app(**otel.providers())
    release = asyncio.Event()
    started: list[int] = []

    @app.task(name="block")
    async def block(n: int) -> None:
        started.append(n)
        await release.wait()

    await block.enqueue_many(range(3))
    base = base_attrs(backend)

    def gauge() -> list[tuple[dict[str, Any], float]]:
        return [(a, p.value) for a, p in otel.metrics().get("aqw.queue.desired_workers", [])]

    async with running(app.worker(concurrency=1, heartbeat=0.1)):
        await eventually(lambda: started == [0], 10, "the first job to start")
        # no job has finished, so no service time yet: 3 jobs (1 running, 2 ready) / 1
        await eventually(lambda: gauge() == [(base, 3)], 10, "desired_workers 3")
        release.set()
        # the three jobs arrived within the last minute: the arrivals keep one worker
        await eventually(lambda: gauge() == [(base, 1)], 10, "desired_workers 1")
