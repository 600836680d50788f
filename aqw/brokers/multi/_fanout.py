"""The parts of a ``MultiBroker`` (``_broker.py``) that span its queues: job records looked
up in each queue (``FanOutRecords``), heartbeats published to every queue so that
``aqw status --queue Q`` lists the worker (``FanOutStatus``), and the depth sampled in every
queue while the home queue's history is read (``FanOutHistory``). The home queue's own
marks, debounce, limits and server are handed out as they are."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import UnknownJob
from ...record import DEFAULT_KEEP_FOR, JobInfo
from ..base import Broker
from ..messages import CancelOutcome, DelayedJob, DepthSample, WaitingJob
from ..parts import DepthHistory, QueueControl


def distinct(brokers: Sequence[Broker]) -> list[Broker]:
    """``brokers``, each once, in order."""
    out: list[Broker] = []
    for broker in brokers:
        if all(broker is not b for b in out):
            out.append(broker)
    return out


class FanOutRecords:
    """The job records of several queues: a job is looked up in each, the home queue's
    first; running states are read from every queue."""

    def __init__(self, brokers: Sequence[Broker], names: Sequence[str]) -> None:
        self._brokers = distinct(brokers)  # the home broker first
        self._names = tuple(names)
        self.shared = all(b.records.shared for b in self._brokers)

    async def _holder(self, job_id: str) -> Broker | None:
        for broker in self._brokers:
            if await broker.records.record(job_id) is not None:
                return broker
        return None

    async def record(self, job_id: str) -> JobInfo | None:
        holder = await self._holder(job_id)
        return None if holder is None else await holder.records.record(job_id)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        holder = await self._holder(job_id)
        return "unknown" if holder is None else await holder.records.cancel(job_id, keep_for)

    async def cancel_requested(self, job_id: str) -> bool:
        return any([await b.records.cancel_requested(job_id) for b in self._brokers])

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        holder = await self._holder(job_id)
        if holder is None:
            raise UnknownJob(f"no job {job_id!r} in queues {', '.join(self._names)}")
        return await holder.records.wait_finished(job_id, timeout)

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        # Written only where a running record with the state's fencing token exists.
        for broker in self._brokers:
            await broker.records.set_running_state(job_id, state)

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        for broker in self._brokers:
            state = await broker.records.running_state(job_id)
            if state is not None:
                return state
        return None

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for broker in self._brokers:
            if len(out) < limit:
                out += await broker.records.running_states(limit - len(out))
        return out


class FanOutStatus:
    """Heartbeats of a worker of several queues: published to (and withdrawn from) every
    queue, read back merged by worker name."""

    def __init__(self, brokers: Sequence[Broker]) -> None:
        self._brokers = distinct(brokers)
        self.shared = all(b.status.shared for b in self._brokers)

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        for broker in self._brokers:
            await broker.status.publish_heartbeat(worker, data, ttl)

    async def heartbeats(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for broker in self._brokers:
            for beat in await broker.status.heartbeats():
                seen.setdefault(str(beat.get("worker")), beat)
        return list(seen.values())

    async def remove_heartbeat(self, worker: str) -> None:
        for broker in self._brokers:
            await broker.status.remove_heartbeat(worker)


class FanOutHistory:
    """The depth history of several queues: each queue samples its own depth (its dashboard
    shows it); the home queue's samples and delayed page are read."""

    def __init__(self, home: DepthHistory, brokers: Sequence[Broker]) -> None:
        self._home = home
        self._each = [b.history for b in distinct(brokers) if b.history is not None]
        self.shared = home.shared

    async def sample(self, at: float) -> None:
        for history in self._each:
            await history.sample(at)

    async def since(self, at: float) -> list[DepthSample]:
        return await self._home.since(at)

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        return await self._home.delayed_page(start, count)


class FanOutControl:
    """The controls of a worker's several queues: the home queue's, except ``paused``, which
    reads every queue's flag (one read each: the worker polls it about once a second), tells
    the ``MultiBroker`` which queues are paused (it fetches from the others only), and is
    True when all of them are (the worker then fetches nothing)."""

    def __init__(
        self,
        home: QueueControl,
        each: Mapping[str, QueueControl],
        saw: Callable[[frozenset[str]], None],
    ) -> None:
        self._home = home
        self._each = dict(each)
        self._saw = saw
        self.shared = home.shared

    async def pause(self) -> bool:
        return await self._home.pause()

    async def resume(self) -> bool:
        return await self._home.resume()

    async def waiting_counts(self) -> dict[int, int]:
        return await self._home.waiting_counts()

    async def waiting_page(self, level: int, after: str | None, count: int) -> list[WaitingJob]:
        return await self._home.waiting_page(level, after, count)

    async def delete_waiting(self, level: int, entry_id: str) -> bool:
        return await self._home.delete_waiting(level, entry_id)

    async def promote(self, job_id: str) -> bool:
        return await self._home.promote(job_id)

    async def find(self, job_id: str) -> bytes | None:
        return await self._home.find(job_id)

    async def paused(self) -> bool:
        flags = {name: await control.paused() for name, control in self._each.items()}
        names = frozenset(name for name, paused in flags.items() if paused)
        self._saw(names)
        return len(names) == len(flags)


def fan_out_control(
    home: Broker, brokers: Mapping[str, Broker], saw: Callable[[frozenset[str]], None]
) -> FanOutControl | None:
    """The ``FanOutControl`` of ``brokers`` when every queue has controls, else None (a
    worker of these queues does not read a pause)."""
    each = {name: b.control for name, b in brokers.items() if b.control is not None}
    if home.control is None or len(each) < len(brokers):
        return None
    return FanOutControl(home.control, each, saw)
