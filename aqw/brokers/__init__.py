"""Brokers, chosen by URL: ``redis://``, ``rediss://``, ``sqs://`` or ``memory://``."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigError
from ._local_records import CancelOutcome
from ._schedule_marks import ScheduleMark
from .base import Broker, DeadJob, Delivery, Failure, Finish, QueueDepth
from .memory import MemoryBroker
from .redis import RedisBroker, split_queue

__all__ = [
    "Broker",
    "CancelOutcome",
    "DeadJob",
    "Delivery",
    "Failure",
    "Finish",
    "QueueDepth",
    "ScheduleMark",
    "from_url",
]


def from_url(url: str, queue: str = "default") -> Broker:
    """The broker a URL names.

    - ``memory://`` (in-process; ``memory://name`` picks the queue name)
    - ``redis://host:port/db?queue=name`` or ``rediss://...``
    - ``sqs://QUEUE_NAME?region=...&endpoint_url=...`` or ``sqs://`` + a queue URL
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        name = urlsplit(url).netloc or queue
        return MemoryBroker(name)
    if scheme in ("redis", "rediss", "unix"):
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
        f"unknown broker URL {url!r}: expected memory://, redis://, rediss:// or sqs://"
    )
