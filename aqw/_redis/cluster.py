"""Redis Cluster: clients from ``redis+cluster://`` URLs, and the key rules of one slot.

``redis+cluster://[user:password@]host:port[,host:port...]/[?queue=q&option=value]`` (and
``rediss+cluster://`` with TLS) names a cluster by a few of its nodes; the client discovers
the others. The client keeps the policy of ``make_client``: bounded timeouts and no command
sent twice by the client itself. A ``MOVED`` or ``ASK`` redirect is still followed (the
node that answered it did not run the command), so is ``TRYAGAIN``; a command whose
connection broke, or that met ``CLUSTERDOWN`` during a failover, is *not* re-sent (it may
have run: an XADD re-sent would enqueue a job twice). It raises, the next command
rediscovers the slots, and aqw's own loops retry where a step is safe to repeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, SlotNotCoveredError, TryAgainError

from ..errors import ConfigError

#: URL schemes that name a cluster, and whether they use TLS.
CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}

#: Errors a cluster raises while its slots move (a failover, a resharding), that go away by
#: themselves: retried by aqw's loops like a broken connection.
CLUSTER_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
)


def cluster_redirect(exc: BaseException) -> str | None:
    """What to do about a ``MOVED`` or ``ASK`` reply to a plain ``redis://`` client (its URL
    names one node of a cluster): one line naming the ``redis+cluster://`` URL to use; None
    for any other error."""
    if not isinstance(exc, AskError):  # MovedError is an AskError
        return None
    node = f"{exc.host}:{exc.port}"
    return (
        f"this Redis is a cluster (it sent the key to {node}): use redis+cluster://{node} "
        "(or rediss+cluster:// with TLS), which finds the other nodes by itself"
    )


def is_cluster_url(url: str) -> bool:
    """True for a ``redis+cluster://`` or ``rediss+cluster://`` URL."""
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def is_cluster(client: Any) -> bool:
    """True when ``client`` is a ``redis.asyncio.cluster.RedisCluster``."""
    return isinstance(client, RedisCluster)


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The ``host:port`` pairs a cluster URL names, in order; a clear ``ConfigError`` for
    a URL that names none, a bad port or a database other than 0."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    nodes: list[tuple[str, int]] = []
    for item in netloc.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = port, "6379"
        host = host.strip("[]")  # an IPv6 address is written [::1]:7000
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"broker URL {redact(url)!r}: expected host:port[,host:port...] after "
                f"{parts.scheme}://, got {item.strip()!r}"
            )
        nodes.append((host, int(port)))
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError(
            f"broker URL {redact(url)!r}: a cluster has only database 0, got {parts.path!r}"
        )
    return nodes


def redact(url: str) -> str:
    """``url`` without its user name and password."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return url.replace(parts.netloc, parts.netloc.rpartition("@")[2], 1)


def make_cluster_client(url: str, **overrides: Any) -> RedisCluster:
    """A ``RedisCluster`` client for a cluster URL that never re-sends a command by itself
    (``make_client`` adds its timeouts as ``overrides``).

    ``retry=Retry(NoBackoff(), 0)`` turns off the client's re-sending after a connection
    error, a timeout or ``CLUSTERDOWN`` (``cluster_error_retry_attempts`` is ignored when a
    ``retry`` is given); redirects (``MOVED``, ``ASK``, ``TRYAGAIN``) are followed whatever
    it says, up to 16 per command. The connections to each node keep redis-py's default of
    no retries. Query options (``?ssl_ca_certs=...``) and ``overrides`` reach the client."""
    scheme = urlsplit(url).scheme.lower()
    nodes = cluster_nodes(url)
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    single = "rediss" if CLUSTER_SCHEMES[scheme] else "redis"
    # The credentials and options, written as a plain URL of the first node, are read by
    # redis-py's own parser; every node named becomes a startup node.
    first_host, first_port = nodes[0]
    host = f"[{first_host}]" if ":" in first_host else first_host
    plain = f"{single}://{auth + '@' if auth else ''}{host}:{first_port}/0"
    if parts.query:
        plain += "?" + parts.query
    try:
        parsed: dict[str, Any] = dict(parse_url(plain))
    except ValueError as exc:  # an option redis-py cannot read
        raise ConfigError(f"broker URL {redact(url)!r}: {exc}") from None
    for name in ("host", "port", "db"):
        parsed.pop(name, None)
    if parsed.pop("connection_class", None) is SSLConnection:
        parsed["ssl"] = True
    options: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}
    options.update(overrides)
    options.update(parsed)  # the URL's own options win, as in ``Redis.from_url``
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], **options)


async def gather_on(client: Any, *steps: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather(*steps)`` of commands on ``client``, a cluster client set up first:
    redis-py's setup of a cluster client (reading its nodes and slots, on first use and
    after a node failed), when several commands start it at once, can close connections
    other commands are using ("Connection closed by server": 7 of 15 fresh clients whose
    first step was six commands at once)."""
    if is_cluster(client):
        await client.initialize()
    return list(await asyncio.gather(*steps))


def hash_slot(key: str) -> int:
    """The cluster slot of ``key`` (its hash tag's, when it has one)."""
    return int(key_slot(key.encode()))


def has_hash_tag(key: str) -> bool:
    """True when ``key`` has a hash tag: a ``{`` with a ``}`` after it and something between
    (Redis then hashes only what is between)."""
    start = key.find("{")
    return start >= 0 and key.find("}", start + 1) > start + 1


def same_slot_fence_key(key: str) -> str:
    """The fencing counter of lease key ``key`` on a cluster, in the key's own slot:
    ``<key>:fence`` when the key has a hash tag, else ``{<key>}:fence`` (the whole key
    becomes the tag, which hashes like the key itself). An untagged key holding a ``}``
    cannot be wrapped so: ``ConfigError``."""
    if has_hash_tag(key):
        return f"{key}:fence"
    if "}" not in key:
        return f"{{{key}}}:fence"
    raise ConfigError(
        f"lease key {key!r} cannot have its fencing counter in its own cluster slot: give "
        "it a hash tag ('{customer:7}:lock') or leave out the '}'"
    )
