"""Brokers, chosen by URL: ``memory://``, ``redis://`` (and ``rediss://``, ``unix://``,
``redis+cluster://``, ``rediss+cluster://``), ``sqs://``, ``nats://``, and any scheme a package adds
through the ``aqw.brokers`` entry-point group.

A scheme names a *family* through one table (``FAMILIES``): a function ``(url, queue,
partitions) -> Broker``. A family outside aqw registers its scheme as an entry point whose
object is a function ``(url, queue) -> Broker``::

    [project.entry-points."aqw.brokers"]
    plug = "plugin_broker:from_url"

so that ``pip install aqw-plug`` makes ``App("plug://...")`` work without touching aqw
(``docs/brokers/writing-a-broker.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from ..errors import ConfigError, extra_hint
from . import memory
from .base import Broker, check_partitions
from .messages import (
    CancelOutcome,
    DeadJob,
    DelayedJob,
    Delivery,
    DepthSample,
    Failure,
    Finish,
    QueueDepth,
    ScheduleMark,
)
from .multi import MultiBroker

__all__ = [
    "ENTRY_POINTS",
    "FAMILIES",
    "Broker",
    "CancelOutcome",
    "DeadJob",
    "DelayedJob",
    "Delivery",
    "DepthSample",
    "Failure",
    "Finish",
    "MultiBroker",
    "QueueDepth",
    "ScheduleMark",
    "from_url",
    "with_partitions",
]

#: The entry-point group a family outside aqw registers its URL scheme in.
ENTRY_POINTS = "aqw.brokers"

#: A family's opener: (url, queue, partitions) -> the broker. Only a family that spreads a
#: queue over partitions accepts ``partitions`` > 1.
Family = Callable[[str, str, int | None], Broker]


def _memory(url: str, queue: str, partitions: int | None) -> Broker:
    if partitions is not None:
        check_partitions(partitions)  # one process has no node to outgrow: nothing to spread
    return memory.from_url(url, queue)


#: The Redis family's URL schemes.
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _redis(url: str, queue: str, partitions: int | None) -> Broker:
    # redis-py is loaded when a URL asks for Redis: an app on another broker, and
    # ``import aqw``, do without its import (about 0.2 s of CPU at every start).
    from . import redis

    return redis.from_url(url, queue, partitions)


def _sqs(url: str, queue: str, partitions: int | None) -> Broker:
    _one_partition(partitions, "SQS scales a queue by itself")
    try:
        from .sqs import SQSBroker
    except ImportError as exc:  # pragma: no cover - depends on installed extras
        raise ConfigError(f"the sqs:// broker needs the 'sqs' extra: {extra_hint('sqs')}") from exc
    broker: Broker = SQSBroker.from_url(url, queue)
    return broker


def _postgres(url: str, queue: str, partitions: int | None) -> Broker:
    _one_partition(partitions, "a PostgreSQL queue is one table")
    try:
        from .postgres import from_url as postgres_url
    except ImportError as exc:  # pragma: no cover - depends on installed extras
        raise ConfigError(
            f"the postgresql:// broker needs the 'postgres' extra: {extra_hint('postgres')}"
        ) from exc
    broker: Broker = postgres_url(url, queue)
    return broker


def _nats(url: str, queue: str, partitions: int | None) -> Broker:
    _one_partition(partitions, "a JetStream queue grows with the cluster, by its replicas")
    try:
        from .nats import from_url as nats_url
    except ImportError as exc:  # pragma: no cover - depends on installed extras
        raise ConfigError(
            f"the nats:// broker needs the 'nats' extra: {extra_hint('nats')}"
        ) from exc
    return nats_url(url, queue)


#: URL scheme -> the family that opens it.
FAMILIES: dict[str, Family] = {
    "memory": _memory,
    **dict.fromkeys(REDIS_SCHEMES, _redis),
    "sqs": _sqs,
    "postgresql": _postgres,
    "postgres": _postgres,
    "nats": _nats,
}


def _one_partition(partitions: int | None, why: str) -> None:
    if partitions is not None and check_partitions(partitions) > 1:
        raise ConfigError(f"partitions={partitions}: only a Redis queue is partitioned ({why})")


def _registered(scheme: str) -> Family | None:
    """The family an installed package registers for ``scheme`` (entry point group
    ``aqw.brokers``), as an opener of the table's shape; None when there is none."""
    from importlib.metadata import entry_points  # read for a scheme outside aqw only

    found = [ep for ep in entry_points(group=ENTRY_POINTS) if ep.name.lower() == scheme]
    if not found:
        return None
    opener = found[0].load()
    if not callable(opener):
        raise ConfigError(
            f"the entry point {found[0].value!r} of {scheme}:// in {ENTRY_POINTS!r} is not a "
            "function (url, queue) -> Broker"
        )

    def family(url: str, queue: str, partitions: int | None) -> Broker:
        _one_partition(partitions, f"a {scheme}:// queue is not")
        broker = opener(url, queue)
        if not isinstance(broker, Broker):
            raise ConfigError(
                f"the {scheme}:// family ({found[0].value}) returned {type(broker).__name__}, "
                "not an aqw.Broker"
            )
        return broker

    return family


def from_url(url: str, queue: str = "default", *, partitions: int | None = None) -> Broker:
    """The broker a URL names.

    - ``memory://`` (in-process; ``memory://name`` picks the queue name)
    - ``redis://host:port/db?queue=name`` or ``rediss://...``
    - ``redis+cluster://host:port[,host:port...]/?queue=name`` (``rediss+cluster://`` with
      TLS): a Redis Cluster, found from the nodes named
    - ``sqs://QUEUE_NAME?region=...&endpoint_url=...`` or ``sqs://`` + a queue URL
    - ``postgresql://user@host/db?queue=name&schema=aqw``: a queue in PostgreSQL tables
    - any scheme an installed package registers in the ``aqw.brokers`` entry-point group

    A Redis URL's ``&partitions=P`` (or ``partitions``, which wins) spreads the queue over
    P streams (``PartitionedBroker``); 1 is the plain layout. The in-process broker ignores
    it (one process has no node to outgrow); the others refuse it.
    """
    scheme = urlsplit(url).scheme.lower()
    family = FAMILIES.get(scheme) or _registered(scheme)
    if family is None:
        known = ", ".join(f"{s}://" for s in FAMILIES)
        raise ConfigError(
            f"unknown broker URL {url!r}: expected {known}, or a scheme an installed package "
            f"registers in the {ENTRY_POINTS!r} entry points"
        )
    return family(url, queue, partitions)


def with_partitions(broker: Broker, partitions: int | None) -> Broker:
    """``broker`` (given as an object) spread over ``partitions`` (None: as it is): a
    ``RedisBroker`` becomes a ``PartitionedBroker`` on its client; an in-process broker is
    kept (nothing to spread); anything else with ``partitions`` > 1 is a ConfigError."""
    if partitions is None:
        return broker
    if broker.in_process:
        check_partitions(partitions)
        return broker
    from . import redis  # a broker object given with partitions: the Redis family's

    return redis.spread(broker, check_partitions(partitions))
