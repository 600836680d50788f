"""The calls of a ``MultiBroker`` (``multi.py``) that name no delivery: they fan out to the
broker of every queue (due jobs, hand-backs, running-job states, heartbeats, depth, stats),
or look a job up in each queue (its record, cancellation, the wait for its end)."""

from __future__ import annotations

from typing import Any

from ...errors import UnknownJob
from ...record import DEFAULT_KEEP_FOR, JobInfo
from ..base import Broker, QueueDepth
from ..local.records import CancelOutcome
from ..messages import total_counters


class FanOut:
    """The fan-out half of ``MultiBroker``: it provides ``names``, ``brokers`` (queue name ->
    broker) and ``home`` (the broker of producing, leases and the DLQ calls)."""

    names: tuple[str, ...]
    brokers: dict[str, Broker]
    home: Broker

    def queue_brokers(self, *, home: bool = False) -> list[Broker]:
        """The queues' brokers, each once (``home``: the home broker first)."""
        out: list[Broker] = [self.home] if home else []
        for broker in self.brokers.values():
            if all(broker is not b for b in out):
                out.append(broker)
        return out

    async def give_back_unstarted(self, running: set[str]) -> int:
        return sum([await b.give_back_unstarted(running) for b in self.queue_brokers()])

    async def promote_due(self) -> float | None:
        waits = [await b.promote_due() for b in self.queue_brokers()]
        due = [w for w in waits if w is not None]
        return min(due) if due else None

    async def _holder(self, job_id: str) -> Broker | None:
        for broker in self.queue_brokers(home=True):
            if await broker.record(job_id) is not None:
                return broker
        return None

    async def record(self, job_id: str) -> JobInfo | None:
        holder = await self._holder(job_id)
        return None if holder is None else await holder.record(job_id)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        holder = await self._holder(job_id)
        return "unknown" if holder is None else await holder.cancel(job_id, keep_for)

    async def cancel_requested(self, job_id: str) -> bool:
        return any([await b.cancel_requested(job_id) for b in self.queue_brokers(home=True)])

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        holder = await self._holder(job_id)
        if holder is None:
            raise UnknownJob(f"no job {job_id!r} in queues {', '.join(self.names)}")
        return await holder.wait_finished(job_id, timeout)

    async def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        # Written only where a running record with the state's fencing token exists.
        for broker in self.queue_brokers():
            await broker.set_job_state(job_id, state, ttl)

    async def clear_job_state(self, job_id: str) -> None:
        for broker in self.queue_brokers():
            await broker.clear_job_state(job_id)

    async def job_state(self, job_id: str) -> dict[str, str] | None:
        for broker in self.queue_brokers():
            state = await broker.job_state(job_id)
            if state is not None:
                return state
        return None

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for broker in self.queue_brokers():
            out += await broker.job_states(limit - len(out)) if len(out) < limit else []
        return out

    # heartbeats go to every queue, so ``aqw status --queue Q`` lists the worker

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        for broker in self.queue_brokers():
            await broker.publish_heartbeat(worker, data, ttl)

    async def heartbeats(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for broker in self.queue_brokers():
            for beat in await broker.heartbeats():
                seen.setdefault(str(beat.get("worker")), beat)
        return list(seen.values())

    async def remove_heartbeat(self, worker: str) -> None:
        for broker in self.queue_brokers():
            await broker.remove_heartbeat(worker)

    async def depths(self) -> dict[str, QueueDepth]:
        """Each queue's depth, by name."""
        return {name: await self.brokers[name].depth() for name in self.names}

    async def depth(self) -> QueueDepth:
        return QueueDepth.total((await self.depths()).values())

    async def stats(self) -> dict[str, int]:
        return total_counters([await broker.stats() for broker in self.queue_brokers()])
