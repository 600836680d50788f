"""One worker on several queues: ``MultiBroker``, the broker a worker consumes through.

Each queue keeps its own broker (stream or SQS queue, leases, delayed set, DLQ, stats, job
records). A fetch is filled from them in strict order (an earlier queue's waiting job is
always taken first) or by weight (smooth weighted round robin over the slots asked for; an
idle queue's share goes to the others) without waiting; only when all are empty does it
wait: Redis queues on one server in one blocking read over all of their streams
(``_redis_wait.py``), others each queue in turn for a short slice (never several blocking
reads at once: a cancelled blocking read can be swallowed, or leave entries it took with
this consumer).

Each delivery remembers its queue (``queue_of``): its settle steps, keep-alive and hand-back
go to that queue's broker. Calls without a delivery fan out (due jobs, recovery, depth,
stats, heartbeats, running-job states); job records are looked up in every queue. Producing,
leases and locks, schedule marks, views and the DLQ calls go to the *home* broker (the
app's): resource locks (``ctx.lock``) are shared by the jobs of every queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from ..errors import ConfigError
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..record import DEFAULT_KEEP_FOR
from ._flow import Limits
from ._multi_fanout import FanOut
from ._queue_plan import QueuePlan, check_queue, queue_plan, sqs_url_for
from ._redis_wait import can_wait_together, wait_together
from ._schedule_marks import ScheduleMark
from ._views import DelayedJob, DepthSample
from .base import Broker, DeadJob, Delivery, Failure, Finish
from .redis import RedisBroker

__all__ = [
    "QUEUE_ATTRIBUTE",
    "MultiBroker",
    "QueuePlan",
    "check_queue",
    "queue_of",
    "queue_plan",
    "sqs_url_for",
]

#: The ``Delivery.attributes`` entry naming the queue a delivery came from.
QUEUE_ATTRIBUTE = "aqw-queue"

#: Seconds of each queue's turn while every queue is empty (brokers without a shared read).
WAIT_SLICE = 0.05


def queue_of(delivery: Delivery, default: str = "") -> str:
    """The queue a ``MultiBroker`` delivery came from (``default`` for any other)."""
    return delivery.attributes.get(QUEUE_ATTRIBUTE, default)


class MultiBroker(FanOut, Broker):
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
        self.home = home if home is not None else self.brokers[self.names[0]]
        super().__init__(self.home.queue)
        self.system = self.home.system
        self.enforces_limits = self.home.enforces_limits
        errors: list[type[BaseException]] = []
        for broker in (self.home, *self.brokers.values()):
            errors += [e for e in broker.transient_errors if e not in errors]
        self.transient_errors = tuple(errors)
        self.weights = None if weights is None else tuple(float(w) for w in weights)
        self._credit = dict.fromkeys(self.names, 0.0)

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

    def set_priority_share(self, share: float) -> None:
        super().set_priority_share(share)
        for broker in self.queue_brokers():
            broker.set_priority_share(share)

    # -- producing: the home queue ---------------------------------------------------------

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self.home.publish(jobs)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self.home.schedule(jobs, run_at)

    @property
    def keyed_enqueue(self) -> bool:
        return self.home.keyed_enqueue

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        return await self.home.publish_unique(job, ttl, run_at)

    async def publish_debounced(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        return await self.home.publish_debounced(job, debounce, debounce_max)

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        """Up to ``count`` deliveries from the queues, by order or weight, without waiting;
        only when every queue is empty, wait up to ``block`` seconds for the first."""
        if count <= 0:
            return []
        got = await (self._take_strict(count) if self.weights is None else self._take(count))
        if got or block <= 0:
            return got
        return await self._wait(count, block)

    async def _from(self, name: str, count: int, block: float | None) -> list[Delivery]:
        got = await self.brokers[name].fetch(count, block or 0.0)
        return _tagged(name, got)

    async def _take_strict(self, count: int) -> list[Delivery]:
        out: list[Delivery] = []
        for name in self.names:
            out += await self._from(name, count - len(out), None)
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

    async def _take(self, count: int) -> list[Delivery]:
        out: list[Delivery] = []
        empty: set[str] = set()
        for name, share in self._shares(count).items():
            if share:
                got = await self._from(name, share, None)
                out += got
                if len(got) < share:
                    empty.add(name)
        assert self.weights is not None
        heaviest = sorted(zip(self.weights, self.names, strict=True), key=lambda p: -p[0])
        for _, name in heaviest:  # an idle queue's share goes to the others
            if len(out) >= count:
                break
            if name not in empty:
                out += await self._from(name, count - len(out), None)
        return out

    async def _wait(self, count: int, block: float) -> list[Delivery]:
        """One blocking read over every queue's streams when they are Redis queues on one
        server (``_redis_wait.py``); else each queue in turn waits a short slice, until one
        delivers or ``block`` passes."""
        queues = [self.brokers[name] for name in self.names]
        if can_wait_together(queues):
            redis_queues = [q for q in queues if isinstance(q, RedisBroker)]
            woken = await wait_together(redis_queues, self.consumer, count, block)
            return [_tagged(self.names[i], [delivery])[0] for i, delivery in woken]
        deadline = time.monotonic() + block
        while True:
            started = time.monotonic()
            for name in self.names:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                got = await self._from(name, count, min(WAIT_SLICE, left))
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

    # -- settling: the delivery's own queue ------------------------------------------------

    async def ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        record_ttl: float = 0.0,
        finish: Finish | None = None,
    ) -> bool:
        return await self.broker_of(delivery).ack(delivery, job, lease, record_ttl, finish)

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        return await self.broker_of(delivery).retry(delivery, job, run_at, lease, failure)

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float = DEFAULT_KEEP_FOR,
    ) -> str | None:
        broker = self.broker_of(delivery)
        return await broker.dead_letter(delivery, job, failure, attempts, lease, keep_for)

    async def requeue(
        self, delivery: Delivery, lease: Lease | None, job: Job | None = None
    ) -> bool:
        return await self.broker_of(delivery).requeue(delivery, lease, job)

    async def defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        return await self.broker_of(delivery).defer(delivery, job, run_at, lease)

    async def is_completed(self, job: Job) -> bool:
        return await self.home.is_completed(job)

    # -- the home queue's: job leases, schedule marks, views, the DLQ (``aqw dlq --queue Q``)

    def job_lease_backend(self, job: Job, delivery: Delivery | None = None) -> LeaseBackend:
        return self._starting(delivery).job_lease_backend(job, delivery)

    def limited_lease_backend(
        self, job: Job, limits: Limits, delivery: Delivery | None = None
    ) -> LeaseBackend:
        return self._starting(delivery).limited_lease_backend(job, limits, delivery)

    def _starting(self, delivery: Delivery | None) -> Broker:
        """Where a start is checked: the queue of its delivery (which holds it), else home."""
        return self.home if delivery is None else self.broker_of(delivery)

    async def schedule_marks(self) -> dict[str, ScheduleMark]:
        return await self.home.schedule_marks()

    async def set_schedule_mark(self, task: str, mark: ScheduleMark) -> None:
        await self.home.set_schedule_mark(task, mark)

    async def sample_depth(self, at: float) -> None:
        await self.home.sample_depth(at)

    async def depth_history(self, since: float) -> list[DepthSample]:
        return await self.home.depth_history(since)

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        return await self.home.delayed_page(start, count)

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
