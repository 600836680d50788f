"""``NatsBroker``: one queue on NATS JetStream (``aqw.brokers.nats`` docstring for the model)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from urllib.parse import urlsplit

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from ...flow import Limits, completion_key
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Broker
from ..messages import DeadJob, Delivery, Failure, Finish, QueueDepth, failure_fields
from ..parts import StartLimits
from . import _dead
from ._dead import DeadLetters
from ._debounce import KvDebounce
from ._delayed import Delayed
from ._history import KvDepthHistory
from ._keys import Keys
from ._layout import (
    TRANSIENT,
    Layout,
    Settings,
    check_queue,
    ensure_consumer,
    open_buckets,
    open_queue,
    settled_or_closed,
    warn_durability,
)
from ._leases import KvLeaseBackend
from ._levels import NatsLevels
from ._limits import KvLimiter
from ._pull import NoWaitPull
from ._records import KvJobRecords
from ._repair import REPAIR_EVERY, Part, Repairer
from ._run_limits import KvRunLimits
from ._start import NatsStart, still_ours
from ._state import KvScheduleMarks, KvWorkerStatus
from ._unique import UniqueEnqueue
from ._window import RECORD_REVISION, Held, Windows

#: The AckWait of a queue whose workers said nothing longer (seconds).
DEFAULT_ACK_WAIT = 30.0

#: Seconds a settle or a renewal waits for the server's reply.
REPLY_TIMEOUT = 2.0

#: Seconds after the connection is back from an outage before a repair of what a killed
#: server may have left (``_repair.py``).
REPAIR_AFTER_OUTAGE = 1.0

_warned: set[str] = set()
log = logging.getLogger("aqw.brokers.nats")

#: The failure a ``_retry`` is given by ``_defer``: a put-off, not a failed attempt.
_DEFER = Failure("", "")


class NatsBroker(Broker):
    """Queue ``queue`` on the JetStream servers ``servers`` (``nats://host:port`` each)."""

    system = "nats"
    # The counts come from several consumers' and streams' info, read one after another.
    depth_lag = 2.0
    transient_errors = TRANSIENT

    def __init__(
        self, queue: str, servers: Sequence[str], settings: Settings | None = None
    ) -> None:
        self._records = KvJobRecords(check_queue(queue), partial(self._kv, "records"))
        self._debouncer = KvDebounce(Layout(queue), partial(self._js_kv, "keys"), self._records)
        super().__init__(
            queue,
            records=self._records,
            status=KvWorkerStatus(partial(self._kv, "state")),
            marks=KvScheduleMarks(partial(self._kv, "state")),
            history=KvDepthHistory(self.depth, partial(self._js_kv, "depth"), Layout(queue)),
            debounce=self._debouncer,
            flow_limits=StartLimits(shared=True),
        )
        self.servers = list(servers)
        self._run_limits = self.run_limits = KvRunLimits(partial(self._kv, "state"))
        self.settings = settings or Settings()
        self.names = Layout(queue)
        self._want_ack_wait = self.settings.ack_wait or DEFAULT_ACK_WAIT
        self._windows = Windows(self._want_ack_wait)
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        self._leases: KvLeaseBackend | None = None
        self._keys: Keys | None = None
        self._buckets: dict[str, KeyValue] = {}  # layout.open_buckets
        self._limiter: KvLimiter | None = None
        self._dlq: DeadLetters | None = None
        self._delayed: Delayed | None = None
        self._unique: UniqueEnqueue | None = None
        self.levels: NatsLevels | None = None
        self._counts: dict[str, int] = {}
        self._connecting = asyncio.Lock()
        self._repairer: Repairer | None = None
        self._repair_at = 0.0  # time.monotonic() of the next repair

    async def _kv(self, name: str) -> KeyValue:
        await self.connect()
        return self._buckets[name]

    async def _js_kv(self, name: str) -> tuple[JetStreamContext, KeyValue]:
        kv = await self._kv(name)
        return self._jet(), kv

    def describe(self) -> str:
        hosts = ",".join(urlsplit(s).hostname or "?" for s in self.servers)
        return f"nats://{hosts} queue={self.queue}"

    def sibling(self, queue: str) -> NatsBroker:
        return NatsBroker(queue, self.servers, self.settings)

    def expect_lease_ttl(self, seconds: float) -> None:
        if self.settings.ack_wait is None:
            self._want_ack_wait = max(self._want_ack_wait, float(seconds))

    async def start_consuming(self, consumer: str) -> None:
        """The queue's AckWait raised to the workers' longest lease TTL, now known."""
        await super().start_consuming(consumer)
        await self._run_limits.refresh()  # the limits changed at run time, then every 0.5 s
        want, names, js = self._want_ack_wait, self.names, self._js
        if js is not None and self.settings.ack_wait is None and want > self._windows.ack_wait:
            args = (names.stream, names.consumer, names.subject, want, False)
            self._windows.set_ack_wait(await ensure_consumer(js, *args, self.settings.max_deliver))
            self._fix_window()
            if self.levels is not None:
                await self.levels.raise_ack_wait(self._windows.ack_wait)

    # -- lifecycle ------------------------------------------------------------------------

    async def connect(self) -> None:
        if self._sub is not None:
            return
        async with self._connecting:
            if self._sub is None:
                await self._open()

    async def _open(self) -> None:
        nc, js, ack_wait, replicas = await open_queue(
            self.servers,
            self.names,
            self.settings,
            self._want_ack_wait,
            REPLY_TIMEOUT * 2,
            self._reconnected,
        )
        self._windows.set_ack_wait(ack_wait)
        self._fix_window()
        # a bucket made while a cluster's node is down or rejoining can be refused for a
        # moment (no peers for placement): tried again, as the streams are
        await settled_or_closed(nc, lambda: self._open_parts(nc, js))
        self._nc, self._js = nc, js
        self._repairer = Repairer(nc, js)
        warn_durability(nc, replicas, _warned)

    def _fix_window(self) -> None:
        """A window the URL fixed (``ack_wait=``) is what a lease renewal must beat."""
        exact = self.settings.ack_wait is not None
        self.delivery_window = self._windows.ack_wait if exact else None

    async def _reconnected(self) -> None:
        # The server may be back from a kill, its consumers and streams restored from
        # different moments: looked at soon, not at the next regular repair.
        self._repair_at = min(self._repair_at, time.monotonic() + REPAIR_AFTER_OUTAGE)
        if self._repairer is not None:
            self._repairer.after_outage()

    async def _open_parts(self, nc: Client, js: JetStreamContext) -> None:
        """The buckets, the dead letters, the promoter, the priority levels' watch and the
        subscription, on a connection whose streams and consumers are ready."""
        names, settings = self.names, self.settings
        self._buckets.update(await open_buckets(js, names, settings.replicas))
        self._leases = KvLeaseBackend(self._buckets["leases"])
        self._keys = Keys(self._buckets["keys"])
        state = self._buckets["state"]
        self._limiter = KvLimiter(state, self._leases)
        self._dlq = DeadLetters(js, names)
        promoter = NoWaitPull(nc, names.delayed_stream, names.promoter)
        self._delayed = Delayed(js, names, promoter, self._debouncer.promote)
        self._unique = UniqueEnqueue(
            self._keys, self._records, js, names, self._delayed, self._announce
        )
        levels = NatsLevels(nc, js, state, names, self._windows, settings.max_deliver)
        levels.exact = settings.ack_wait is not None
        await levels.start()
        self.levels = levels
        self._sub = await js.pull_subscribe_bind(names.consumer, names.stream)

    async def close(self) -> None:
        await self._run_limits.stop()
        nc, self._nc, self._sub = self._nc, None, None
        if self.levels is not None:
            await self.levels.stop()
        if nc is not None:
            await nc.close()

    def _jet(self) -> JetStreamContext:
        if self._js is None:
            raise ConnectionError(f"the nats:// broker of queue {self.queue!r} is not connected")
        return self._js

    # -- producing ------------------------------------------------------------------------

    async def _send(self, subject: str, stream: str, data: bytes, **headers: str) -> None:
        await self._jet().publish(subject, data, stream=stream, headers=headers or None)

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self._announce(jobs)
        names = self.names
        revisions = await asyncio.gather(*(self._records.enqueued(j) for j in jobs))
        await asyncio.gather(
            *(
                self._send(
                    names.subject_for(j.priority),
                    names.stream,
                    j.encode(),
                    **({} if rev is None else {RECORD_REVISION: str(rev)}),
                )
                for j, rev in zip(jobs, revisions, strict=True)
            )
        )

    async def _announce(self, jobs: Sequence[Job]) -> None:
        """Connected, and the consumers of the priority levels of ``jobs`` made."""
        await self.connect()
        if any(j.priority for j in jobs):
            assert self.levels is not None
            await self.levels.announce(j.priority for j in jobs)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        if run_at <= time.time():
            await self.publish(jobs)
            return
        await self._announce(jobs)
        assert self._delayed is not None
        await asyncio.gather(*(self._records.enqueued(j, run_at) for j in jobs))
        await self._delayed.add([j.encode() for j in jobs], run_at)

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        """The key claimed pending, the job published, the claim confirmed (``_unique.py``)."""
        await self.connect()
        assert self._unique is not None
        return await self._unique.publish(job, ttl, run_at)

    async def is_completed(self, job: Job) -> bool:
        key = completion_key(job)
        if key is None:
            return False
        await self.connect()
        assert self._keys is not None
        return await self._keys.completed(key)

    async def promote_due(self) -> float | None:
        await self.connect()
        assert self._delayed is not None
        return await self._delayed.promote(REPLY_TIMEOUT)

    # -- consuming ------------------------------------------------------------------------

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        await self.connect()
        assert self._sub is not None and self.levels is not None
        return await self.levels.fetch(self._sub, count, block, share)

    async def keep_alive(self, delivery: Delivery) -> bool:
        held = self._windows.hold(delivery)
        if held is None:
            return False
        sent = time.monotonic()
        left = self._windows.left(held)
        assert self._nc is not None
        await self._nc.request(held.msg.reply, b"+WPI", timeout=min(REPLY_TIMEOUT, left))
        self._windows.renewed(held, sent)
        return True

    async def give_back_unstarted(self, running: set[str]) -> int:
        return sum([await self.give_back(d, None) for d in self._windows.unstarted(running)])

    # -- leases ---------------------------------------------------------------------------

    def lease_backend(self) -> KvLeaseBackend:
        if self._leases is None:
            raise ConnectionError(f"the nats:// broker of queue {self.queue!r} is not connected")
        return self._leases

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        """Nothing to take over: a stopped consumer's window lapses and the server delivers
        its messages again by itself. What a killed server can leave (ack-pending entries
        of messages gone, acked messages still in the stream) is put right here, at most
        every ``REPAIR_EVERY`` seconds (``_repair.py``)."""
        repairer, now = self._repairer, time.monotonic()
        if repairer is None or now < self._repair_at:
            return []
        self._repair_at = now + REPAIR_EVERY
        try:
            done = await repairer.run(self._repair_parts(), self.settings.max_deliver <= 0)
        except TRANSIENT:
            raise  # the worker's outage handling says it once
        except Exception as exc:  # a repair is a clean-up: it never stops the worker
            log.warning(
                "nats: queue %r: the repair after a server restart failed: %r", self.queue, exc
            )
            return []
        if done:
            log.warning(
                "nats: queue %r: cleared %d ack-pending entries of messages no longer in its "
                "stream and purged %d messages already acked (left by a server killed "
                "without a clean shutdown)",
                self.queue,
                done.cleared,
                done.purged,
            )
        return []

    def _repair_parts(self) -> list[Part]:
        names = self.names
        levels = (0, *(self.levels.active if self.levels is not None else ()))
        parts = [Part(names.stream, names.consumer_for(n), names.subject_for(n)) for n in levels]
        parts.append(Part(names.delayed_stream, names.promoter, names.delayed_subject))
        return parts

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        check = still_ours(self._windows, lambda d: self.ack(d, None, None), delivery)
        flow = (self._limiter, limits) if limits and self._limiter is not None else None
        revision = None if delivery is None else delivery.attributes.get(RECORD_REVISION)
        return NatsStart(
            self.lease_backend(),
            self._records,
            job,
            self.consumer,
            check,
            flow,
            int(revision) if revision and revision.isdigit() else None,
        )

    # -- settling -------------------------------------------------------------------------

    async def _take(self, delivery: Delivery, lease: Lease | None) -> Held | None:
        """The delivery, taken off the held ones, while it is still this consumer's: its
        window open and, with a lease, the lease key still this token's (released here).
        None, touching nothing of another holder's, when it is not."""
        held = self._windows.hold(delivery)
        if held is None:
            if lease is not None:  # its window has closed: the job runs again (redelivered);
                with contextlib.suppress(*TRANSIENT):  # its next start need not wait out
                    await self.lease_backend().release(lease.key, lease.token)  # the TTL
            return None
        if lease is not None and not await self.lease_backend().release(lease.key, lease.token):
            return None
        self._windows.drop(delivery)
        return held if held.open(self._windows.margin) else None  # the release took a trip

    def _bump(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1

    async def _reply(self, held: Held, payload: bytes) -> None:
        assert self._nc is not None
        await self._nc.request(held.msg.reply, payload, timeout=REPLY_TIMEOUT)

    async def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> bool:
        held = await self._take(delivery, lease)
        if held is None:
            return False
        key = completion_key(job)
        if key is not None and job is not None and record_ttl > 0:
            assert self._keys is not None
            await self._keys.complete(key, job.id, record_ttl)
        await self._reply(held, b"+ACK")
        self._bump("processed")
        if job is not None:
            fields = finish.fields(self.consumer, time.time())
            await self._records.finish(job, finish.state, fields, finish.keep_for)
        return True

    async def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> bool:
        held = await self._take(delivery, lease)
        if held is None:
            return False
        names, once = self.names, f"retry.{delivery.id}"
        if run_at <= time.time():
            subject = names.subject_for(job.priority)
            await self._send(subject, names.stream, job.encode(), **{"Nats-Msg-Id": once})
        else:
            assert self._delayed is not None
            await self._delayed.add([job.encode()], run_at, once)
        await self._reply(held, b"+ACK")
        self._bump("retried" if failure is not _DEFER else "deferred")
        if failure is _DEFER:
            await self._records.deferred(job, run_at)
        else:
            await self._records.retrying(job, run_at, failure_fields(failure) if failure else {})
        return True

    async def _defer(
        self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> bool:
        return await self._retry(delivery, job, run_at, lease, _DEFER)

    async def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None:
        held = await self._take(delivery, lease)
        if held is None:
            return None
        assert self._dlq is not None
        body = _dead.encode(delivery.data, job, failure, attempts)
        entry = await self._dlq.add(body, f"dead.{delivery.id}")
        await self._reply(held, b"+ACK")
        self._bump("dead")
        if job is not None:
            fields = Finish(failure=failure).fields(failure.worker or self.consumer, time.time())
            await self._records.finish(job, "dead", {**fields, "dlq_entry": entry}, keep_for)
        return entry

    async def _give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        held = await self._take(delivery, lease)
        if held is None:
            return False
        await self._reply(held, b"-NAK")
        if job is not None:
            await self._records.given_back(job.id)
        return True

    # -- inspection -----------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        await self.connect()
        assert self._dlq is not None and self._delayed is not None and self.levels is not None
        waiting, in_flight = await self.levels.counts()
        return QueueDepth(waiting, in_flight, await self._delayed.count(), await self._dlq.count())

    async def stats(self) -> dict[str, int]:
        return dict(self._counts)

    async def _dead(self) -> DeadLetters:
        await self.connect()
        assert self._dlq is not None
        return self._dlq

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        return await (await self._dead()).entries(count, after)

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        return await (await self._dead()).get(entry_id)

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        dead = await self._dead()
        await self._announce([job for _, job in entries])
        done = await dead.replay(entries)
        for job in done:
            await self._records.replayed(job)
        return len(done)

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        return await (await self._dead()).delete(entry_ids)
