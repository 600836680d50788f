"""What a queue is made of on JetStream, created on connect when missing: its names, streams,
consumer, key-value buckets, and the warning about what the server's disk syncs miss.

One queue ``q`` is:

- stream ``AQW_q`` (work-queue retention, file store) on subject ``aqw.q.jobs``, with the
  durable pull consumer ``aqw`` every worker of the queue shares (explicit acks, ``AckWait``
  the lease window); a priority level N > 0 has subject ``aqw.q.jobs.pN`` in the same
  stream and its own consumer ``aqw-pN``, made when a producer first uses it (``_levels.py``);
- stream ``AQW_q_DELAYED`` (``aqw.q.delayed``): scheduled jobs and retries until their time,
  moved by ``promote_due`` through its own durable consumer ``promoter``;
- stream ``AQW_q_DLQ`` (``aqw.q.dead``, limits retention): dead letters, one message each;
- buckets ``AQW_q_LEASES`` (job leases, locks: the revision is the fencing token),
  ``AQW_q_KEYS`` (idempotency keys and completion records), ``AQW_q_STATE`` (worker
  heartbeats, schedule marks, the priority levels in use), ``AQW_q_RECORDS`` (job records)
  and ``AQW_q_DEPTH`` (the dashboard's depth samples, ``_history.py``).

A stream per queue, not per app: a queue's retention, limits, replicas and removal are its
own, a work-queue stream allows only non-overlapping consumers (one per queue here), and
each stream has its own raft group on a cluster, so queues spread over the servers.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from ...errors import ConfigError
from ..base import Broker
from ..messages import DEPTH_KEEP
from ._records import MAX_AGE

log = logging.getLogger("aqw.brokers.nats")

#: A queue name that is a valid stream name and subject token.
_QUEUE = re.compile(r"^[A-Za-z0-9_-]{1,200}$")

#: The client's "unreachable right now" errors, besides the base's (the worker retries them).
TRANSIENT: tuple[type[BaseException], ...] = (
    *Broker.transient_errors,
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.NoRespondersError,
    nats.errors.FlushTimeoutError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,  # a stream's leader moving (a node lost)
)

T = TypeVar("T")

#: How many times connecting tries the JetStream API calls that make the queue ready.
SETUP_TRIES = 4

#: JetStream's answers while a cluster is short of a peer or between leaders (a node killed
#: or rejoining): "no suitable peers for placement" (10005), "JetStream system temporarily
#: unavailable" (10008), "cluster can not handle request" (10009). Setting up tries them again.
SETTLING_CODES = frozenset({10005, 10008, 10009})


def settling(exc: BaseException) -> bool:
    """``exc`` is an answer a cluster gives while it settles, worth a later try."""
    if isinstance(exc, TimeoutError | nats.js.errors.ServiceUnavailableError):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code in SETTLING_CODES


async def settled(step: Callable[[], Awaitable[T]]) -> T:
    """``step()``, tried again (``SETUP_TRIES`` in all, backing off) while the cluster answers
    as one that settles (``settling``); any other error, or the last, is raised."""
    for attempt in range(SETUP_TRIES):
        try:
            return await step()
        except Exception as exc:
            if attempt == SETUP_TRIES - 1 or not settling(exc):
                raise
        await asyncio.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


#: Seconds within which a publish with the same ``Nats-Msg-Id`` is dropped as a duplicate.
DUPLICATE_WINDOW = 120.0


def check_queue(queue: str) -> str:
    if not _QUEUE.match(queue):
        raise ConfigError(
            f"queue {queue!r}: a nats:// queue name is letters, digits, '_' and '-' only "
            "(it names the queue's stream and subjects)"
        )
    return queue


@dataclass(frozen=True)
class Layout:
    """The names of one queue's streams, subjects, consumers and buckets."""

    queue: str

    @property
    def stream(self) -> str:
        return f"AQW_{self.queue}"

    @property
    def subject(self) -> str:
        return f"aqw.{self.queue}.jobs"

    def subject_for(self, level: int) -> str:
        """The subject of priority level ``level``: level 0 is ``subject``."""
        return f"aqw.{self.queue}.jobs.p{level}" if level else self.subject

    def consumer_for(self, level: int) -> str:
        """The durable consumer of priority level ``level``: level 0 is ``consumer``."""
        return f"{self.consumer}-p{level}" if level else self.consumer

    @property
    def delayed_stream(self) -> str:
        return f"AQW_{self.queue}_DELAYED"

    @property
    def delayed_subject(self) -> str:
        return f"aqw.{self.queue}.delayed"

    @property
    def dlq_stream(self) -> str:
        return f"AQW_{self.queue}_DLQ"

    @property
    def dlq_subject(self) -> str:
        return f"aqw.{self.queue}.dead"

    @property
    def leases_bucket(self) -> str:
        return f"AQW_{self.queue}_LEASES"

    @property
    def keys_bucket(self) -> str:
        return f"AQW_{self.queue}_KEYS"

    @property
    def state_bucket(self) -> str:
        return f"AQW_{self.queue}_STATE"

    @property
    def depth_bucket(self) -> str:
        return f"AQW_{self.queue}_DEPTH"

    @property
    def records_bucket(self) -> str:
        return f"AQW_{self.queue}_RECORDS"

    #: The durable consumers.
    consumer = "aqw"
    promoter = "promoter"


#: The ``promoter`` consumer's AckWait: a backstop. A delayed job's delivery the promoter
#: never handled (a pass whose answer came after its wait, a worker killed mid-pass) comes
#: back this soon, not after 30 s; a pass acks or naks each delivery at once, and a move
#: repeated after a late ack is dropped as a duplicate (``due.<seq>``). The pulls that could
#: leave a delivery with a stopped process are gone (``_pull.py``, docs/brokers/nats.md).
PROMOTER_ACK_WAIT = 5.0


@dataclass(frozen=True)
class Settings:
    """A queue's JetStream settings, from the URL (``aqw.brokers.nats`` docstring)."""

    replicas: int = 1
    ack_wait: float | None = None  # None: the workers' longest lease TTL (at least 30 s)
    max_deliver: int = -1
    dlq_limit: int = 100_000


async def _stream(js: JetStreamContext, config: StreamConfig) -> None:
    """The stream, created when missing (or read, made by another process meanwhile: 2.9.10
    refuses the create as "subjects overlap"); one that exists gets the subjects it lacks."""
    assert config.name is not None
    try:
        info = await js.stream_info(config.name)
    except NotFoundError:
        try:
            await js.add_stream(config)
            return
        except nats.js.errors.BadRequestError:
            info = await js.stream_info(config.name)
    have = list(info.config.subjects or [])
    missing = [s for s in config.subjects or [] if s not in have]
    if missing:
        info.config.subjects = have + missing
        await js.update_stream(info.config)


async def ensure_streams(js: JetStreamContext, names: Layout, settings: Settings) -> None:
    """The queue's three streams, created when missing (an existing one kept as it is)."""
    file, r = StorageType.FILE, settings.replicas
    window = DUPLICATE_WINDOW
    work = RetentionPolicy.WORK_QUEUE
    await _stream(
        js,
        StreamConfig(
            name=names.stream,
            subjects=[names.subject, f"{names.subject}.*"],
            retention=work,
            storage=file,
            num_replicas=r,
            duplicate_window=window,
        ),
    )
    await _stream(
        js,
        StreamConfig(
            name=names.delayed_stream,
            subjects=[names.delayed_subject],
            retention=work,
            storage=file,
            num_replicas=r,
            duplicate_window=window,
        ),
    )
    await _stream(
        js,
        StreamConfig(
            name=names.dlq_stream,
            subjects=[names.dlq_subject],
            storage=file,
            num_replicas=r,
            duplicate_window=window,
            max_msgs=settings.dlq_limit,
            discard=DiscardPolicy.OLD,
        ),
    )


async def ensure_consumer(
    js: JetStreamContext,
    stream: str,
    durable: str,
    subject: str,
    ack_wait: float,
    exact: bool,
    max_deliver: int = -1,
) -> float:
    """The durable pull consumer ``durable``, created when missing; its ``AckWait`` raised to
    ``ack_wait`` (set to it when ``exact``: the URL's ``ack_wait=``). Returns the AckWait it
    has now: the window every delivery of it gets."""
    try:
        info = await js.consumer_info(stream, durable)
    except NotFoundError:
        info = None
    have = None if info is None else info.config.ack_wait
    if have is not None and (have == ack_wait or (have > ack_wait and not exact)):
        return float(have)
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        filter_subject=subject,
        max_ack_pending=-1,
        max_waiting=4096,
    )
    made = await js.add_consumer(stream, config)
    return float(made.config.ack_wait or ack_wait)


async def bucket(
    js: JetStreamContext, name: str, replicas: int, ttl: float | None = None
) -> KeyValue:
    """The KV bucket ``name`` (one revision per key, file store, entries dropped ``ttl``
    seconds after their last write), created when missing."""
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        return await js.create_key_value(
            bucket=name, history=1, storage=StorageType.FILE, replicas=replicas, ttl=ttl
        )


async def open_buckets(js: JetStreamContext, names: Layout, replicas: int) -> dict[str, KeyValue]:
    """The queue's buckets by role, each created when missing (records and samples expire)."""
    return {
        "leases": await bucket(js, names.leases_bucket, replicas),
        "keys": await bucket(js, names.keys_bucket, replicas),
        "state": await bucket(js, names.state_bucket, replicas),
        "records": await bucket(js, names.records_bucket, replicas, MAX_AGE),
        "depth": await bucket(js, names.depth_bucket, replicas, DEPTH_KEEP),
    }


def durability_note(version: str, replicas: int) -> str | None:
    """The warning to log once at start when an acknowledged write may not be on disk, or
    None. nats-server syncs its file store to disk every 2 minutes by default; 2.9.x has no
    setting to sync on every write (2.10 adds ``sync_interval``, ``always``), and a client
    cannot read that setting. A write acknowledged by an R1 stream lives in one server's page
    cache until then."""
    if replicas >= 3:
        return None
    old = version.startswith(("2.9.", "2.8.", "2.7.", "2.6."))
    why = (
        f"nats-server {version} has no setting to sync on every write"
        if old
        else f"nats-server {version}: aqw cannot read its sync_interval (set it to 'always')"
    )
    return (
        f"nats: streams of R{replicas} are synced to disk every 2 minutes by default ({why}): "
        "a job acknowledged at enqueue can be lost if the server's machine crashes before "
        "the sync; use replicas=3 on a cluster (docs/brokers/nats.md)"
    )


async def open_queue(
    servers: list[str],
    names: Layout,
    settings: Settings,
    ack_wait: float,
    timeout: float,
    reconnected: Callable[[], Awaitable[None]] | None = None,
) -> tuple[Client, JetStreamContext, float, int]:
    """A connection (reconnecting forever, ``reconnected`` called each time), its JetStream
    context, the queue's streams and consumers ready; its AckWait and stream's replicas."""
    nc = await nats.connect(
        servers=servers,
        name=f"aqw {names.queue}",
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        allow_reconnect=True,
        reconnected_cb=reconnected,
    )
    js = nc.jetstream(timeout=timeout)
    exact = settings.ack_wait is not None

    async def ready() -> tuple[float, int]:
        await ensure_streams(js, names, settings)
        window = await ensure_consumer(
            js,
            names.stream,
            names.consumer,
            names.subject,
            ack_wait,
            exact,
            settings.max_deliver,
        )
        await ensure_consumer(
            js,
            names.delayed_stream,
            names.promoter,
            names.delayed_subject,
            PROMOTER_ACK_WAIT,
            True,
        )
        info = await js.stream_info(names.stream)  # as it is: made here or before
        return window, int(info.config.num_replicas or 1)

    window, replicas = await settled_or_closed(nc, ready)
    return nc, js, window, replicas


async def settled_or_closed(nc: Client, step: Callable[[], Awaitable[T]]) -> T:
    """``settled(step)`` on the new connection ``nc``, closed when it fails; a cluster still
    settling after every try is unreachable for now (``ConnectionError``), as a worker's
    start (and ``aqw worker --wait-for-broker``) takes it."""
    try:
        return await settled(step)
    except BaseException as exc:
        await nc.close()
        if isinstance(exc, Exception) and settling(exc) and not isinstance(exc, TimeoutError):
            raise ConnectionError(f"JetStream is not ready: {exc}") from exc
        raise


def warn_durability(nc: Client, replicas: int, warned: set[str]) -> None:
    """Log ``durability_note`` once per server version in this process (``warned``)."""
    v = nc.connected_server_version
    version = f"{v.major}.{v.minor}.{v.patch}"
    note = durability_note(version, replicas)
    if note is not None and version not in warned:
        warned.add(version)
        log.warning(note)
