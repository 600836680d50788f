"""Redis clients for aqw: bounded timeouts and retries, and broker URLs whose aqw options
(``?queue=``, ``?partitions=``) are taken off without losing the encoding of the others."""

from __future__ import annotations

from typing import Any, Protocol, cast
from urllib.parse import parse_qsl, quote, urlencode

from redis.asyncio import Redis as Redis  # the client type, for code outside the plumbing
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import ResponseError as ResponseError  # a script's error reply, likewise
from redis.exceptions import TimeoutError as RedisTimeoutError

from .cluster import is_cluster_url, make_cluster_client
from .connections import with_timed_writes
from .scripts import REPEATABLE_SHAS

#: The errors of the Redis client library: for code that reports them without importing it.
CLIENT_ERRORS: tuple[type[Exception], ...] = (RedisError,)

#: The client's errors that mean "the server cannot be reached right now".
UNREACHABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)


def no_retry() -> Retry:
    """The retry policy of a client that never re-sends a command by itself."""
    return Retry(NoBackoff(), 0)


def client_from_url(url: str, **options: Any) -> Redis:
    """A plain client of ``url`` with redis-py's ``options`` as given (``make_client`` is
    aqw's bounded one)."""
    return Redis.from_url(url, **options)


#: Longest BLOCK of one XREADGROUP; short enough to notice a stop quickly.
MAX_BLOCK = 2.0


#: Commands safe to send a second time after the first one's reply was lost with its
#: connection: they only read (a second read answers what the first would have). A write is
#: never among them: a lost XADD reply may belong to a job that was written.
REPEATABLE_COMMANDS = frozenset(
    {
        "DBSIZE", "EXISTS", "GET", "HEXISTS", "HGET", "HGETALL", "HKEYS", "HLEN", "HMGET",
        "HSCAN", "HVALS", "INFO", "LINDEX", "LLEN", "LRANGE", "MGET", "PING", "PTTL", "SCAN",
        "SCARD", "SISMEMBER", "SMEMBERS", "SSCAN", "TIME", "TTL", "TYPE", "XINFO", "XLEN",
        "XPENDING", "XRANGE", "XREVRANGE", "ZCARD", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE",
        "ZRANK", "ZREVRANGE", "ZREVRANGEBYSCORE", "ZSCAN", "ZSCORE",
    }
)  # fmt: skip


def repeatable(args: tuple[Any, ...]) -> bool:
    """True when the command ``args`` is safe to send again after its reply was lost: a
    read (``REPEATABLE_COMMANDS``), a ``SCRIPT LOAD``, or the EVALSHA of a script that
    ``scripts.REPEATABLE`` lists."""
    if not args:
        return False
    name, arg = _word(args[0]), _word(args[1]) if len(args) > 1 else ""
    if name == "EVALSHA":
        return arg.lower().encode() in REPEATABLE_SHAS
    if name == "SCRIPT":
        return arg == "LOAD"
    return name in REPEATABLE_COMMANDS


def _word(value: object) -> str:
    """A command's name or argument as upper-case text."""
    return (value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)).upper()


class RepeatingRedis(Redis):
    """A ``Redis`` client that sends a command once more, on a new connection, when the
    first try failed with a ``ConnectionError`` and the command is ``repeatable``: the first
    read after a Redis restart on a connection the client had not yet seen closed (it was
    closed while a command was on its way, or no FIN ever came) answers instead of failing.
    Any other command fails as before: the caller cannot know whether it ran."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        execute: Any = super().execute_command
        try:
            return await execute(*args, **options)
        except RedisConnectionError:
            if not repeatable(args):
                raise
        # redis-py closed the failed connection and put it back: this opens it anew.
        return await execute(*args, **options)


#: The connection bound of aqw's clients: redis-py's own before its release 8.
UNBOUNDED_POOL = 2**31


def make_client(url: str, **overrides: Any) -> Redis:
    """A client with bounded timeouts that never re-sends a command that may have run.

    A command whose reply was lost may have run: re-sending an XADD would enqueue a job twice.
    aqw retries where it knows a step is safe to repeat (every settle script refuses a second
    run, a lease acquire by the same token is taken again), so the client does not, except
    the reads and the few scripts it knows to be safe (``RepeatingRedis``). A connection the
    server closed is re-opened by the next command (``connections``). A ``redis+cluster://``
    URL gets a ``RedisCluster`` with the same policy (``cluster.make_cluster_client``): it
    has the commands of ``Redis`` that aqw uses, so it is typed as one here."""
    options: dict[str, Any] = {
        "socket_connect_timeout": 5.0,
        "socket_timeout": MAX_BLOCK + 10.0,
        "socket_keepalive": True,
        "health_check_interval": 30,
        "retry": Retry(NoBackoff(), 0),
        # redis-py 8 caps a pool at 100 connections and fails the 101st command at once
        # ("Too many connections") instead of waiting: a burst of awaited enqueues, or a
        # hundred tasks polling for one lock, would fail. aqw's clients keep the earlier
        # releases' bound (a URL's ``?max_connections=`` still sets one).
        "max_connections": UNBOUNDED_POOL,
    }
    options.update(overrides)
    if is_cluster_url(url):
        client: Any = make_cluster_client(url, **options)
        return cast(Redis, client)
    plain = RepeatingRedis.from_url(url, **options)
    with_timed_writes(plain)  # the write bound without a task per command
    return plain


def split_queue(url: str, default: str) -> tuple[str, str]:
    """Take ``?queue=name`` off a redis URL: (url without it, queue name)."""
    plain, queue = split_option(url, "queue")
    return plain, default if queue is None else queue


def split_option(url: str, option: str) -> tuple[str, str | None]:
    """Take ``?<option>=value`` off a redis URL: (url without it, its last value or None).

    The other query options are decoded and percent-encoded again, in their order (blank
    ones kept), so redis-py reads the values written: ``%2B``, ``%26`` and ``%20`` give
    ``+``, ``&`` and a space, and a bare ``+`` is a plus sign (``ssl_ca_certs=/a+b/ca.pem``),
    not a space as in an HTML form. The rest of the URL is kept as written (``urlunsplit``
    would turn ``unix:///path`` into ``unix:/path``)."""
    head, hash_, fragment = url.partition("#")
    base, _, query = head.partition("?")
    pairs = parse_qsl(query.replace("+", "%2B"), keep_blank_values=True)
    values = [value for name, value in pairs if name == option]
    rest = urlencode([(k, v) for k, v in pairs if k != option], safe="/", quote_via=quote)
    plain = base + ("?" + rest if rest else "") + hash_ + fragment
    return plain, values[-1] if values else None


class OnRedis(Protocol):
    """A broker on a Redis client (``RedisBroker``), as ``describe_broker`` sees it."""

    @property
    def client(self) -> Any: ...
    @property
    def queue(self) -> str: ...


def describe_broker(broker: OnRedis) -> str:
    """``RedisBroker.describe``: ``redis://host:port/db queue=q`` (``rediss://`` with TLS,
    ``unix://path?db=n`` on a socket, ``redis cluster host:port,...`` on a cluster), read
    from the client's connection settings: never the user name or the password."""
    client = broker.client
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", None) or {}
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        where = f"unix://{kwargs['path']}?db={db}"
    elif kwargs.get("host"):
        connection = getattr(getattr(pool, "connection_class", None), "__name__", "")
        scheme = "rediss" if "ssl" in connection.lower() else "redis"
        where = f"{scheme}://{kwargs['host']}:{kwargs.get('port', 6379)}/{db}"
    else:  # a cluster client, or one whose settings this cannot read
        where = _cluster_where(client)
    return f"{where} queue={broker.queue}"


def _cluster_where(client: Any) -> str:
    """``redis cluster host:port,...`` (the startup nodes, up to three, then ``,...``), or
    ``redis`` for a client whose nodes this cannot read."""
    nodes = [n for n in getattr(client, "startup_nodes", None) or [] if hasattr(n, "host")]
    if not nodes:
        return "redis"
    tls = getattr(client, "connection_kwargs", {}).get("connection_class")
    scheme = "rediss cluster" if "ssl" in getattr(tls, "__name__", "").lower() else "redis cluster"
    hosts = ",".join(
        f"[{n.host}]:{n.port}" if ":" in n.host else f"{n.host}:{n.port}" for n in nodes[:3]
    )
    return f"{scheme} {hosts}{',...' if len(nodes) > 3 else ''}"
