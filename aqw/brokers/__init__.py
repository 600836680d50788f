"""Brokers, chosen by URL: ``redis://``, ``rediss://``, ``sqs://`` or ``memory://``."""

from __future__ import annotations

from urllib.parse import urlsplit

from .._redis.client import split_option
from ..errors import ConfigError
from .base import Broker, DeadJob, Delivery, Failure, Finish, QueueDepth
from .local.marks import ScheduleMark
from .local.records import CancelOutcome
from .memory import MemoryBroker
from .multi import MultiBroker, sqs_url_for
from .redis import PartitionedBroker, RedisBroker, check_partitions, split_queue

__all__ = [
    "Broker",
    "CancelOutcome",
    "DeadJob",
    "Delivery",
    "Failure",
    "Finish",
    "MultiBroker",
    "PartitionedBroker",
    "QueueDepth",
    "ScheduleMark",
    "broker_for_queue",
    "from_url",
    "with_partitions",
]


def from_url(url: str, queue: str = "default", *, partitions: int | None = None) -> Broker:
    """The broker a URL names.

    - ``memory://`` (in-process; ``memory://name`` picks the queue name)
    - ``redis://host:port/db?queue=name`` or ``rediss://...``
    - ``redis+cluster://host:port[,host:port...]/?queue=name`` (``rediss+cluster://`` with
      TLS): a Redis Cluster, found from the nodes named
    - ``sqs://QUEUE_NAME?region=...&endpoint_url=...`` or ``sqs://`` + a queue URL

    A Redis URL's ``&partitions=P`` (or ``partitions``, which wins) spreads the queue over
    P streams (``PartitionedBroker``); 1 is the plain layout. The in-process broker ignores
    it (one process has no node to outgrow); SQS refuses it (a queue scales by itself).
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        name = urlsplit(url).netloc or queue
        return MemoryBroker(name)
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        plain, name = split_queue(url, queue)
        plain, given = split_option(plain, "partitions")
        count = partitions if partitions is not None else _partitions_option(given)
        if count > 1:
            return PartitionedBroker(plain, name, count)
        return RedisBroker(plain, name)
    if partitions is not None and partitions > 1:
        raise ConfigError(
            f"partitions={partitions}: only a Redis queue is partitioned (SQS scales a queue "
            "by itself)"
        )
    if scheme == "sqs":
        try:
            from .sqs import SQSBroker
        except ImportError as exc:  # pragma: no cover - depends on installed extras
            raise ConfigError(
                "the sqs:// broker needs the 'sqs' extra: pip install 'aqw[sqs]'"
            ) from exc
        broker: Broker = SQSBroker.from_url(url, queue)
        return broker
    raise ConfigError(
        f"unknown broker URL {url!r}: expected memory://, redis://, rediss://, "
        "redis+cluster:// or sqs://"
    )


def broker_for_queue(base: Broker, url: str | None, queue: str) -> Broker:
    """The broker of another queue beside ``base`` (built from ``url``, or None when ``base``
    was given as an object): a Redis queue on ``base``'s client (one connection pool), the
    in-process queue of that name, or the ``sqs://`` URL with the queue name replaced (its
    ``dlq=NAME`` dropped: each queue's own RedrivePolicy names its dead-letter queue)."""
    if isinstance(base, PartitionedBroker):
        return PartitionedBroker(base.client, queue, base.partitions, dlq_limit=base.dlq_limit)
    if isinstance(base, RedisBroker):
        return RedisBroker(base.client, queue, dlq_limit=base.dlq_limit)
    if isinstance(base, MemoryBroker):
        return MemoryBroker(queue, dlq_limit=base.dlq_limit)
    if url is not None and urlsplit(url).scheme.lower() == "sqs":
        return from_url(sqs_url_for(url, queue), queue)
    raise ConfigError(
        f"queue: cannot build a broker for queue {queue!r} beside a {type(base).__name__} "
        "given as an object: give the App a broker URL"
    )


def _partitions_option(given: str | None) -> int:
    """A URL's ``partitions=`` value, checked (absent: 1)."""
    if given is None:
        return 1
    try:
        return check_partitions(int(given))
    except ValueError:
        raise ConfigError(f"partitions must be an integer from 1 to 1024, got {given!r}") from None


def with_partitions(broker: Broker, partitions: int | None) -> Broker:
    """``broker`` (given as an object) spread over ``partitions`` (None: as it is): a
    ``RedisBroker`` becomes a ``PartitionedBroker`` on its client; an in-process broker is
    kept (nothing to spread); anything else with ``partitions`` > 1 is a ConfigError."""
    if partitions is None:
        return broker
    check_partitions(partitions)
    if isinstance(broker, PartitionedBroker):
        if broker.partitions != partitions:
            raise ConfigError(
                f"partitions={partitions}, but the broker given has {broker.partitions}"
            )
        return broker
    if partitions == 1 or isinstance(broker, MemoryBroker):
        return broker
    if isinstance(broker, RedisBroker):
        return PartitionedBroker(
            broker.client, broker.queue, partitions, dlq_limit=broker.dlq_limit
        )
    raise ConfigError(
        f"partitions={partitions}: only a Redis queue is partitioned, not a {type(broker).__name__}"
    )
