"""SQSBroker: the Broker contract on one SQS queue, by delegation to the pieces it owns
(connection, queues, held messages, producing, consuming, leases, settling, dead letters;
batches counted in a ``records=redis://`` store). Job records and heartbeats are kept in the
process (``aqw.brokers.local``). How aqw maps onto SQS: ``aqw.brokers.sqs``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import ConfigError
from ...flow import Limits
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Broker
from ..local import LocalScheduleMarks, LocalStartGuard, LocalWorkerStatus, still_ours
from ..messages import DeadJob, Delivery, Failure, Finish, QueueDepth
from ._batch_stores import store_batches
from ._batching import Batcher
from ._connection import Connection
from ._consuming import Consumer
from ._dead_letters import DeadLetterQueue
from ._held import HeldMessages
from ._keys import Keys, KeyStore, StoreMarks
from ._leases import LockStore, VisibilityLeases
from ._limits import MAX_VISIBILITY, MAX_WAIT
from ._messages import Entry
from ._options import parse_url
from ._producing import Producer
from ._queues import Queues
from ._results import StoreJobRecords
from ._settling import MessageSettler


class SQSBroker(Broker):
    """A queue on Amazon SQS (standard or FIFO). See the package docstring for the mapping."""

    system = "aws_sqs"
    # A retry's visibility is rounded up to whole seconds and the approximate counters are
    # read one by one: the retried message can be counted nowhere as it turns visible.
    depth_lag = 2.0

    def __init__(
        self,
        queue: str,
        *,
        queue_url: str | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        dlq: str | None = None,
        wait: int | None = None,
        visibility: int | None = None,
        default_task: str | None = None,
        create: bool = False,
        lock_store: LeaseBackend | str | None = None,
        records: KeyStore | str | None = None,
        pool: int = 50,
        pollers: int = 10,
    ) -> None:
        keys = Keys(queue, records)  # its store keeps the schedule marks (and batches), shared
        store = keys.redis_store()  # and the final records of jobs read elsewhere
        client = None if store is None else (lambda: store.client)
        self._records = job_records = StoreJobRecords(queue, client)
        marks = StoreMarks(keys) if keys.keeps_marks else LocalScheduleMarks()
        batches, status = store_batches(keys, self.publish), LocalWorkerStatus()
        super().__init__(queue, records=job_records, status=status, marks=marks, batches=batches)
        self._options: dict[str, Any] = {
            "region": region,
            "endpoint_url": endpoint_url,
            "wait": wait,
            "visibility": visibility,
            "default_task": default_task,
            "create": create,
            "lock_store": lock_store,
            "records": records,
            "pool": pool,
            "pollers": pollers,
        }
        self._dlq_option = dlq
        self._queue_url_option = queue_url
        if wait is not None and not 0 <= wait <= MAX_WAIT:
            raise ConfigError(f"sqs wait must be 0-{MAX_WAIT} seconds, got {wait!r}")
        if visibility is not None and not 0 <= visibility <= MAX_VISIBILITY:
            raise ConfigError(f"sqs visibility must be 0-{MAX_VISIBILITY} s, got {visibility!r}")
        if pool < 1 or pollers < 1:
            raise ConfigError(f"sqs pool and pollers must be >= 1, got {pool!r}, {pollers!r}")
        connection = Connection(
            region=region, endpoint_url=endpoint_url, pool=pool, setup=self._setup, queue=queue
        )
        queues = Queues(
            connection, queue, url=queue_url, dlq=dlq, visibility=visibility, create=create
        )
        held = HeldMessages(lease_prefix=f"aqw:{{{queue}}}:lease:")
        locks = LockStore(lock_store)
        producer = Producer(connection, queues)
        dead_letters = DeadLetterQueue(connection, queues, producer, default_task=default_task)
        self._connection, self._queues, self._held, self._locks = connection, queues, held, locks
        self._producer, self._dead_letters, self._keys = producer, dead_letters, keys
        self._consumer = Consumer(
            connection,
            queues,
            held,
            wait=wait,
            pollers=pollers,
            visibility=visibility,
            default_task=default_task,
        )
        self._leases = VisibilityLeases(connection, queues, held, locks)
        self._settler = MessageSettler(
            connection, queues, held, locks, dead_letters, keys, job_records, batches
        )

    def __repr__(self) -> str:
        return f"<SQSBroker queue={self.queue!r} fifo={self.fifo} dlq={self.dlq_name!r}>"

    @classmethod
    def from_url(cls, url: str, queue: str = "default") -> SQSBroker:
        """``sqs://NAME?opts`` or ``sqs://https://host/ACCOUNT/NAME?opts`` (see package doc)."""
        name, settings = parse_url(url, queue)
        return cls(name, **settings)

    def sibling(self, queue: str) -> SQSBroker:
        """Queue ``queue`` with this broker's options; its ``dlq=NAME`` dropped, so its own
        RedrivePolicy names its dead-letter queue (``dlq=none`` is kept)."""
        dlq = self._dlq_option if self._dlq_option == "none" else None
        given = self._queue_url_option  # a queue URL: the same account's queue of that name
        url = None if given is None else given.rstrip("/").rpartition("/")[0] + "/" + queue
        return SQSBroker(queue, queue_url=url, dlq=dlq, **self._options)

    # -- settings, and what connecting found (read-only) --------------------------------------

    @property
    def lock_url(self) -> str | None:
        """The ``locks=`` Redis URL of the lock store, when one was given."""
        return self._locks.url

    @property
    def records_url(self) -> str | None:
        """The ``records=`` URL of the idempotency-key store, when one was given."""
        return self._keys.url

    @property
    def queue_url(self) -> str:
        """The queue's URL: as given, else found by name on connect ("" until then)."""
        return self._queues.url

    @property
    def fifo(self) -> bool:
        """A FIFO queue: by its name, and after connecting by its FifoQueue attribute."""
        return self._queues.fifo

    @property
    def dlq_name(self) -> str | None:
        """The ``dlq=`` option: a queue name, ``none``, or None for the RedrivePolicy's."""
        return self._queues.dlq_name

    @property
    def dlq_url(self) -> str | None:
        """The dead-letter queue's URL; None without one (or before connecting)."""
        return self._queues.dlq_url

    @property
    def max_receives(self) -> int | None:
        """The maxReceiveCount of the queue's RedrivePolicy, once connected."""
        return self._queues.max_receives

    @property
    def create(self) -> bool:
        """Missing queues are created on connect (``create=1``)."""
        return self._queues.create

    def describe(self) -> str:
        """The queue's URL once known (else its name, region and endpoint)."""
        if self._queues.url:
            return f"sqs {self._queues.url}"
        where = ", ".join(
            f"{k}={v}" for k, v in (("region", self.region), ("endpoint", self.endpoint_url)) if v
        )
        return f"sqs queue {self.queue}" + (f" ({where})" if where else "")

    @property
    def region(self) -> str | None:
        return self._connection.region

    @property
    def endpoint_url(self) -> str | None:
        return self._connection.endpoint_url

    @property
    def pool(self) -> int:
        """HTTP connections of the client."""
        return self._connection.pool

    @property
    def wait(self) -> int | None:
        """Long-poll seconds, overriding the runtime's block; None: the runtime's."""
        return self._consumer.wait

    @property
    def visibility(self) -> int | None:
        """The visibility timeout asked for on receive; None: the lease's, else the queue's."""
        return self._consumer.visibility

    @property
    def pollers(self) -> int:
        """Most concurrent ReceiveMessage calls of one fetch."""
        return self._consumer.pollers

    @property
    def default_task(self) -> str | None:
        """The task that consumes plain-JSON bodies of other producers (``task=``)."""
        return self._consumer.default_task

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._connection.connect()

    async def _setup(self, client: Any, stack: contextlib.AsyncExitStack) -> None:
        """What connecting does before the client is used: find the queues, open the lock
        store (the connection calls it)."""
        await self._queues.resolve(client)
        self._locks.open(stack)

    async def start_consuming(self, consumer: str) -> None:
        await super().start_consuming(consumer)
        await self._connection.ensure()
        self._queues.require_dlq()
        await self._settler.send_outbox()  # what a worker killed after a count left unsent

    def expect_lease_ttl(self, seconds: float) -> None:
        """The longest job lease the runtime will take: received messages then start with that
        visibility (unless ``visibility=`` is set), so no lease needs an extension at acquire.
        A hint: without it the acquire extends a visibility that is too short."""
        self._consumer.expect_lease_ttl(seconds)

    async def close(self) -> None:
        await self._connection.close()
        self._locks.close()
        await self._keys.close()

    # -- producing and consuming -----------------------------------------------------------

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self._producer.publish(jobs)
        self._enqueued(jobs, None)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self._producer.schedule(jobs, run_at)
        self._enqueued(jobs, run_at)

    def _enqueued(self, jobs: Sequence[Job], run_at: float | None) -> None:
        """Record jobs just sent, unless a worker in this process has already taken one up
        (its record then says more than "queued")."""
        records = self._records
        for job in jobs:
            if records.info(job.id) is None:
                records.enqueued(job, run_at)

    @property
    def keyed_enqueue(self) -> bool:
        """Only with a ``records=`` store for the keys."""
        return bool(self._keys.enabled)

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        """With ``records=``: claim the key in the store, send, keep the key for ``ttl``
        seconds (see ``aqw.brokers.sqs._keys`` for the windows); without it a ConfigError
        that says how to add one."""

        async def send() -> None:
            if run_at is not None:
                await self.schedule([job], run_at)
            else:
                await self.publish([job])

        return await self._keys.publish_unique(job, ttl, send)

    async def is_completed(self, job: Job) -> bool:
        """True while the key's completion record lives in the ``records=`` store."""
        return await self._keys.is_completed(job)

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        """Up to ``count`` messages (SQS has no priority levels: ``share`` is unused). One
        long poll when the queue looked idle; when a batch came back full (a backlog), up to
        ``pollers`` ReceiveMessage calls run at once, so a fetch of 100 takes one round
        trip. FIFO queues ask one message per call (see package doc)."""
        return await self._consumer.fetch(count, block)

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        """Nothing to do: an unsettled message becomes visible again by itself when its
        visibility timeout (the job's lease) runs out, and is then received anew."""
        return []

    def lease_backend(self) -> LeaseBackend:
        return self._leases

    async def keep_alive(self, delivery: Delivery) -> bool:
        return delivery.id in self._held

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        """The message's visibility (``VisibilityLeases``), the record marked running in this
        process, only while ``delivery`` is held here; ``limits`` are never given (no
        ``flow_limits``: the worker refuses them)."""
        check = still_ours(self, delivery)
        return LocalStartGuard(self._leases, self._records, job, self.consumer, check)

    # -- settling (the records move with the base's steps) ---------------------------------

    async def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> bool:
        """Delete the message; a keyed job's completion record is written first (``records=``)."""
        return await self._settler.ack(delivery, job, lease, finish, record_ttl)

    async def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> bool:
        """Hide the message for the backoff delay; the next receive is the next attempt (the
        body, and so ``job``, cannot change on SQS)."""
        return await self._settler.retry(delivery, job, run_at, lease, failure)

    async def _defer(
        self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> bool:
        """Hide the message until ``run_at``; rate limits and per-key caps are not enforced
        on SQS (the worker refuses them), so only ``aqw.RateLimited`` defers here."""
        return await self._settler.defer(delivery, job, run_at, lease)

    async def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None:
        """The DLQ message's id (the message's own with ``dlq=none``), or None: refused."""
        return await self._settler.dead_letter(delivery, job, failure, attempts, lease, keep_for)

    async def _give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        return await self._settler.give_back(delivery, lease, job)

    # -- inspection ------------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        """Approximate counts from GetQueueAttributes. Messages hidden by a retry or a
        not-yet-due delay count as in flight."""
        return await self._queues.depth()

    async def stats(self) -> dict[str, int]:
        """Counters of this broker instance (SQS keeps none per queue)."""
        return dict(self._settler.counts)

    # -- dead-letter queue -----------------------------------------------------------------

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        return await self._dead_letters.dlq_list(count, after)

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        return await self._dead_letters.dlq_get(entry_id)

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        """Replayed jobs read queued again (in this process's records)."""
        return await self._dead_letters.dlq_replay(entries, self._replayed)

    def _replayed(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self._records.replayed(job)

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        return await self._dead_letters.dlq_delete(entry_ids)

    # -- for tests and debugging: the client, the batchers, a message's SendMessage fields -----

    @property
    def _client(self) -> Any:
        return self._connection.client

    @property
    def _batchers(self) -> dict[tuple[str, str], Batcher]:
        return self._connection.batchers

    def _entry(self, job: Job, delay: int = 0, not_before: float | None = None) -> Entry:
        return self._producer.entry(job, delay, not_before)
