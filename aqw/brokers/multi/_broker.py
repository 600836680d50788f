"""One worker on several queues: ``MultiBroker``, the broker a worker consumes through.

Each queue keeps its own broker (stream or SQS queue, leases, delayed set, DLQ, stats, job
records). A fetch is filled from them in strict order (an earlier queue's waiting job is
always taken first) or by weight (smooth weighted round robin over the slots asked for; an
idle queue's share goes to the others) without waiting; only when all are empty does it
wait: Redis queues on one server in one blocking read over all of their streams
(``Broker.fetch_together``), others each queue in turn for a short slice (never several
blocking reads at once: a cancelled blocking read can be swallowed, or leave entries it
took with this consumer).

Each delivery remembers its queue (``queue_of``): its settle steps, keep-alive and hand-back
go to that queue's broker. Calls without a delivery fan out (due jobs, recovery, depth,
stats); its parts span the queues (``_fanout.py``: job records looked up in every queue,
heartbeats and depth samples in every queue). Producing, leases and locks, the schedule
marks, debounce, limits and the DLQ calls are the *home* broker's (the app's): resource
locks (``ctx.lock``) are shared by the jobs of every queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from ...errors import ConfigError
from ...flow import Limits
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Broker
from ..messages import DeadJob, Delivery, Failure, Finish, QueueDepth, total_counters
from ._fanout import FanOutHistory, FanOutRecords, FanOutStatus, distinct, fan_out_control

__all__ = ["QUEUE_ATTRIBUTE", "MultiBroker", "queue_of"]

#: The ``Delivery.attributes`` entry naming the queue a delivery came from.
QUEUE_ATTRIBUTE = "aqw-queue"

#: Seconds of each queue's turn while every queue is empty (brokers without a shared read).
WAIT_SLICE = 0.05


def queue_of(delivery: Delivery, default: str = "") -> str:
    """The queue a ``MultiBroker`` delivery came from (``default`` for any other)."""
    return delivery.attributes.get(QUEUE_ATTRIBUTE, default)


class MultiBroker(Broker):
    """Several queues' brokers consumed as one, in strict order or by weight.

    Args:
        brokers: queue name -> that queue's broker, in the order of preference.
        weights: one weight > 0 per queue, in the same order; None: strict order.
        home: the broker of producing, leases, locks, schedule marks and the DLQ calls
            (default: the first queue's).

    The brokers belong to the caller (the App): ``close`` leaves them open.
    """

    def __init__(
        self,
        brokers: Mapping[str, Broker],
        weights: Sequence[float] | None = None,
        *,
        home: Broker | None = None,
    ) -> None:
        if not brokers:
            raise ConfigError("queues: name at least one queue")
        if weights is not None and len(weights) != len(brokers):
            raise ConfigError("queues: one weight per queue")
        self.brokers = dict(brokers)
        self.names = tuple(brokers)
        self.home = home = home if home is not None else self.brokers[self.names[0]]
        queues = self.queue_brokers()
        super().__init__(
            home.queue,
            records=FanOutRecords([home, *queues], self.names),
            status=FanOutStatus(queues),
            marks=home.marks,
            history=None if home.history is None else FanOutHistory(home.history, queues),
            control=fan_out_control(home, self.brokers, self._saw_paused),
            rates=home.rates,  # the worker's counts, all its queues together
            debounce=home.debounce,
            flow_limits=home.flow_limits,
            server=home.server,
        )
        self.system = home.system
        self.in_process = home.in_process
        self.depth_lag = max(b.depth_lag for b in self.brokers.values())
        errors: list[type[BaseException]] = []
        for broker in (home, *self.brokers.values()):
            errors += [e for e in broker.transient_errors if e not in errors]
        self.transient_errors = tuple(errors)
        self.weights = None if weights is None else tuple(float(w) for w in weights)
        self._credit = dict.fromkeys(self.names, 0.0)
        #: The queues found paused at the worker's last poll (``control.paused``): not
        #: fetched from nor recovered from.
        self.paused: frozenset[str] = frozenset()

    def _saw_paused(self, names: frozenset[str]) -> None:
        self.paused = names

    def queue_brokers(self, *, home: bool = False) -> list[Broker]:
        """The queues' brokers, each once (``home``: the home broker first)."""
        return distinct([self.home, *self.brokers.values()] if home else [*self.brokers.values()])

    def describe(self) -> str:
        return f"{self.brokers[self.names[0]].describe()} queues={','.join(self.names)}"

    def broker_of(self, delivery: Delivery) -> Broker:
        """The broker of the queue ``delivery`` came from."""
        return self.brokers.get(queue_of(delivery), self.brokers[self.names[0]])

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> None:
        for broker in self.queue_brokers(home=True):
            await broker.connect()

    async def close(self) -> None:
        return None

    async def start_consuming(self, consumer: str) -> None:
        self.consumer = consumer
        for broker in self.queue_brokers():
            await broker.start_consuming(consumer)

    def expect_lease_ttl(self, seconds: float) -> None:
        for broker in self.queue_brokers():
            broker.expect_lease_ttl(seconds)

    # -- producing: the home queue ---------------------------------------------------------

    @property
    def pushes_cancels(self) -> bool:  # type: ignore[override]
        return all(b.pushes_cancels for b in self.queue_brokers())

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        await asyncio.gather(*(b.watch_cancels(on_cancel) for b in self.queue_brokers()))

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self.home.publish(jobs)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self.home.schedule(jobs, run_at)

    @property
    def keyed_enqueue(self) -> bool:
        return self.home.keyed_enqueue

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        return await self.home.publish_unique(job, ttl, run_at)

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        """Up to ``count`` deliveries from the queues, by order or weight, without waiting;
        only when every queue is empty, wait up to ``block`` seconds for the first.
        ``share``: each queue's priority share."""
        if count <= 0:
            return []
        if self.weights is None:
            got = await self._take_strict(count, share)
        else:
            got = await self._take(count, share)
        if got or block <= 0:
            return got
        return await self._wait(count, block, share)

    async def _from(self, name: str, count: int, block: float, share: float) -> list[Delivery]:
        got = await self.brokers[name].fetch(count, block, share)
        return _tagged(name, got)

    async def _take_strict(self, count: int, share: float) -> list[Delivery]:
        out: list[Delivery] = []
        for name in self.names:
            if name in self.paused:
                continue
            out += await self._from(name, count - len(out), 0.0, share)
            if len(out) >= count:
                break
        return out

    def _shares(self, count: int) -> dict[str, int]:
        """``count`` slots dealt by smooth weighted round robin (credits carry over from one
        fetch to the next, so even one slot a fetch splits by weight over time)."""
        assert self.weights is not None
        total = sum(self.weights)
        shares = dict.fromkeys(self.names, 0)
        credit = self._credit
        for _ in range(count):
            for name, weight in zip(self.names, self.weights, strict=True):
                credit[name] += weight
            pick = max(self.names, key=credit.__getitem__)
            credit[pick] -= total
            shares[pick] += 1
        return shares

    async def _take(self, count: int, share: float) -> list[Delivery]:
        out: list[Delivery] = []
        empty: set[str] = set(self.paused)
        for name, slots in self._shares(count).items():
            if slots and name not in empty:
                got = await self._from(name, slots, 0.0, share)
                out += got
                if len(got) < slots:
                    empty.add(name)
        assert self.weights is not None
        heaviest = sorted(zip(self.weights, self.names, strict=True), key=lambda p: -p[0])
        for _, name in heaviest:  # an idle queue's share goes to the others
            if len(out) >= count:
                break
            if name not in empty:
                out += await self._from(name, count - len(out), 0.0, share)
        return out

    async def _wait(self, count: int, block: float, share: float) -> list[Delivery]:
        """One blocking read over every queue's streams when their family can read them at
        once (``Broker.fetch_together``: Redis queues on one server); else each queue in
        turn waits a short slice, until one delivers or ``block`` passes."""
        names = [name for name in self.names if name not in self.paused]
        if not names:
            await asyncio.sleep(min(block, 1.0))
            return []
        queues = [self.brokers[name] for name in names]
        woken = await queues[0].fetch_together(queues, self.consumer, count, block)
        if woken is not None:
            return [_tagged(names[i], [delivery])[0] for i, delivery in woken]
        deadline = time.monotonic() + block
        while True:
            started = time.monotonic()
            for name in names:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                got = await self._from(name, count, min(WAIT_SLICE, left), share)
                if got:
                    return got
            spent = time.monotonic() - started
            if spent < WAIT_SLICE:  # brokers that do not wait (an SQS short poll)
                await asyncio.sleep(min(WAIT_SLICE - spent, max(0.0, deadline - time.monotonic())))

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        out: list[Delivery] = []
        for name in self.names:
            if len(out) >= count:
                break
            if name in self.paused:
                continue
            got = await self.brokers[name].reclaim(count - len(out), lease_ttl, min_idle)
            out += _tagged(name, got)
        return out

    def lease_backend(self) -> LeaseBackend:
        return self.home.lease_backend()

    def job_lease_key(self, job: Job) -> str:
        return self.home.job_lease_key(job)

    def lock_key(self, name: str) -> str:
        return self.home.lock_key(name)

    async def keep_alive(self, delivery: Delivery) -> bool:
        return await self.broker_of(delivery).keep_alive(delivery)

    async def give_back_unstarted(self, running: set[str]) -> int:
        return sum([await b.give_back_unstarted(running) for b in self.queue_brokers()])

    async def promote_due(self) -> float | None:
        waits = [await b.promote_due() for b in self.queue_brokers()]
        due = [w for w in waits if w is not None]
        return min(due) if due else None

    # -- settling: the delivery's own queue ------------------------------------------------

    def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> Coroutine[Any, Any, bool]:
        return self.broker_of(delivery).ack(delivery, job, lease, record_ttl, finish)

    def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> Coroutine[Any, Any, bool]:
        return self.broker_of(delivery).retry(delivery, job, run_at, lease, failure)

    def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> Coroutine[Any, Any, str | None]:
        broker = self.broker_of(delivery)
        return broker.dead_letter(delivery, job, failure, attempts, lease, keep_for)

    def _give_back(
        self, delivery: Delivery, lease: Lease | None, job: Job | None
    ) -> Coroutine[Any, Any, bool]:
        return self.broker_of(delivery).give_back(delivery, lease, job)

    def _defer(
        self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> Coroutine[Any, Any, bool]:
        return self.broker_of(delivery).defer(delivery, job, run_at, lease)

    async def is_completed(self, job: Job) -> bool:
        return await self.home.is_completed(job)

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        """Checked where the delivery is held: its own queue's broker (else the home's)."""
        starting = self.home if delivery is None else self.broker_of(delivery)
        return starting.job_lease_backend(job, limits, delivery)

    # -- inspection: every queue; the dead-letter queue: the home queue's (``aqw dlq --queue Q``)

    async def queue_depths(self) -> dict[str, QueueDepth]:
        """Each queue's depth, by name."""
        return {name: await self.brokers[name].depth() for name in self.names}

    async def depth(self) -> QueueDepth:
        return QueueDepth.total((await self.queue_depths()).values())

    async def stats(self) -> dict[str, int]:
        return total_counters([await broker.stats() for broker in self.queue_brokers()])

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        return await self.home.dlq_list(count, after)

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        return await self.home.dlq_get(entry_id)

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        return await self.home.dlq_replay(entries)

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        return await self.home.dlq_delete(entry_ids)


def _tagged(name: str, deliveries: list[Delivery]) -> list[Delivery]:
    for delivery in deliveries:
        delivery.attributes[QUEUE_ATTRIBUTE] = name
    return deliveries
