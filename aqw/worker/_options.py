"""A worker's options and the queues it serves: the checks of its arguments, the broker it
consumes (a ``MultiBroker`` over several queues, ``aqw/brokers/multi.py``), the routing of
each delivery to its queue's job path, and the depth gauges per queue."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..brokers.base import Broker, QueueDepth, check_priority_share
from ..brokers.multi import MultiBroker, queue_of, queue_plan
from ..errors import ConfigError
from ..flow import rates_in_force
from ..scaling import desired_workers, scaling_inputs
from ._job_path import JobPath
from ._slots import Runner


class QueuesApp(Protocol):
    """What choosing the queues needs of the App."""

    @property
    def broker(self) -> Broker: ...
    @property
    def queue(self) -> str: ...
    def broker_for(self, queue: str) -> Broker: ...


def check_options(
    concurrency: object, prefetch: object, grace: float, heartbeat: float, share: object
) -> None:
    """Refuse a bad worker option with a message naming it."""
    check_priority_share(share)
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"worker concurrency must be an integer >= 1, got {concurrency!r}")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ConfigError(f"worker prefetch must be an integer >= 0, got {prefetch!r}")
    if grace < 0:
        raise ConfigError(f"worker grace must be >= 0 seconds, got {grace!r}")
    if heartbeat <= 0:
        raise ConfigError(f"worker heartbeat must be > 0 seconds, got {heartbeat!r}")


def consumed_broker(
    app: QueuesApp, queues: Sequence[str] | Mapping[str, float] | None
) -> tuple[tuple[str, ...], Broker]:
    """(the queues served, in order; the broker to consume): the app's own broker without
    ``queues`` (or with its queue alone), else a ``MultiBroker`` over each queue's broker,
    whose home (producing, locks, schedule marks) is the app's broker."""
    if queues is None:
        return (app.queue,), app.broker
    plan = queue_plan(queues)
    if plan.names == (app.queue,):
        return plan.names, app.broker
    brokers = {name: app.broker_for(name) for name in plan.names}
    return plan.names, MultiBroker(brokers, plan.weights, home=app.broker)


def route(paths: Mapping[str, JobPath], queues: Sequence[str]) -> Runner:
    """Run each delivery on the job path of its queue (``paths`` is filled after this)."""
    if len(queues) == 1:
        only = queues[0]
        return lambda delivery: paths[only].process(delivery)
    first = queues[0]
    return lambda delivery: paths[queue_of(delivery, first)].process(delivery)


async def depths_of(paths: Mapping[str, JobPath]) -> dict[str, QueueDepth]:
    """The depth of each queue served, by name (each on its own queue's broker)."""
    return {name: await path.broker.depth() for name, path in paths.items()}


async def desired_of(
    paths: Mapping[str, JobPath], depths: Mapping[str, QueueDepth]
) -> dict[str, int]:
    """Each queue's autoscaling signal (``aqw.scaling``), from its depth just read, the live
    workers' heartbeats and its tasks' rate limits."""
    out: dict[str, int] = {}
    for name, depth in depths.items():
        path = paths.get(name)
        if path is None:
            continue
        broker = path.broker
        beats = await broker.status.heartbeats()  # a monitor's is left out
        flows = {n: t.options.flow for n, t in path.tasks.items()}
        out[name] = desired_workers(await scaling_inputs(broker, depth, beats, flows))
    return out


def depth_readings(
    paths: Mapping[str, JobPath],
    depths: Mapping[str, QueueDepth],
    desired: Mapping[str, int] | None = None,
) -> list[tuple[str, float, dict[str, Any]]]:
    """Gauge readings of each queue's depth, with that queue's telemetry attributes."""
    out: list[tuple[str, float, dict[str, Any]]] = []
    for name, depth in depths.items():
        path = paths.get(name)
        if path is not None:
            out += path.tel.depth_readings(depth)
            if desired is not None and name in desired:
                attrs = path.tel.metric_attributes(None)
                out.append(("aqw.queue.desired_workers", float(desired[name]), attrs))
    return out


def rate_readings(paths: Mapping[str, JobPath]) -> list[tuple[str, float, dict[str, Any]]]:
    """Gauge readings of each task's rate limit in force (starts per second; an adaptive
    one's current value), from the run-time limits this process last read: no broker call."""
    out: list[tuple[str, float, dict[str, Any]]] = []
    for path in paths.values():
        store = path.broker.run_limits
        flows = {n: t.options.flow for n, t in path.tasks.items() if t.options.flow.rate}
        if flows:
            changed = store.current() if store is not None else {}
            for row in rates_in_force(flows, changed):
                out.append(
                    (
                        "aqw.task.rate_limit",
                        row["per_second"],
                        path.tel.metric_attributes(row["task"]),
                    )
                )
    return out
