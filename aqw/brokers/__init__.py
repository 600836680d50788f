"""Brokers, chosen by URL: ``redis://``, ``rediss://``, ``sqs://`` or ``memory://``."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigError
from ._local_records import CancelOutcome
from ._schedule_marks import ScheduleMark
from .base import Broker, DeadJob, Delivery, Failure, Finish, QueueDepth
from .memory import MemoryBroker
from .multi import MultiBroker, sqs_url_for
from .redis import RedisBroker, split_queue

__all__ = [
    "Broker",
    "CancelOutcome",
    "DeadJob",
    "Delivery",
    "Failure",
    "Finish",
    "MultiBroker",
    "QueueDepth",
    "ScheduleMark",
    "broker_for_queue",
    "from_url",
]


def from_url(url: str, queue: str = "default") -> Broker:
    """The broker a URL names.

    - ``memory://`` (in-process; ``memory://name`` picks the queue name)
    - ``redis://host:port/db?queue=name`` or ``rediss://...``
    - ``redis+cluster://host:port[,host:port...]/?queue=name`` (``rediss+cluster://`` with
      TLS): a Redis Cluster, found from the nodes named
    - ``sqs://QUEUE_NAME?region=...&endpoint_url=...`` or ``sqs://`` + a queue URL
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        name = urlsplit(url).netloc or queue
        return MemoryBroker(name)
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        plain, name = split_queue(url, queue)
        return RedisBroker(plain, name)
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
