"""Redlock: a ``aqw.lease.LeaseBackend`` spread over N independent Redis servers.

``Lease(RedlockBackend.from_urls([url1, url2, url3]), "customer:7", ttl=10)`` behaves like a
single-server ``aqw.lease.Lease`` (background renewal, cancellation of the block and
``aqw.LeaseLost`` when the lease cannot be kept, compare-token release), but the lease
lives on a majority of the servers, so it survives the loss of a minority of them.

The algorithm (Redlock, https://redis.io/docs/latest/develop/use/patterns/distributed-locks/):

* **acquire** -- ``SET key token NX PX ttl`` plus ``INCR`` of the key's fencing counter
  (``lease_acquire.lua``) on every server concurrently, each call bounded by
  ``per_node_timeout``. The lease is taken when a quorum (``N // 2 + 1``) of servers granted it
  *and* the validity time ``ttl - elapsed - drift`` is still positive, where
  ``drift = ttl * clock_drift_factor + 2 ms``. Otherwise the key is released (compare-token
  ``DEL``) on *all* servers, including those that seemed not to answer, and ``None`` is returned.
* **renew** -- compare-token ``PEXPIRE`` on every server; succeeds when a quorum renewed within
  the validity time. Otherwise it returns False and ``aqw.lease.Lease`` cancels the block.
* **release** -- compare-token ``DEL`` on every server, best effort; True when a quorum released.

A server that errors or does not answer within ``per_node_timeout`` counts as a refusal; no
method raises because of a failed server, not even when all of them fail (acquire then returns
``None``, which ``aqw.lease.Lease`` reports as ``aqw.LeaseUnavailable``).

Fencing tokens. Each server keeps its own counter, so counters drift apart (a server that was
down misses increments; an acquirer that reached only a minority still increments the servers
it reached). The token of a new holder is the maximum of the ``INCR`` results of the servers
that granted the lease, and before it is handed out the counters of the granting servers that
are behind are raised to it (``INCRBY``); the lease is only taken when a quorum of servers both
granted it and hold a counter ``>=`` the token. Any two quorums share a server, and on that
server the next holder's ``INCR`` runs after this holder's raise (its ``SET NX`` only succeeds
once this holder's key is gone), so tokens strictly increase from holder to holder -- as long
as a quorum of the counters survives. Servers that restart empty (no AOF with ``fsync``) lose
their counters and their keys; run them with persistence, or keep a restarted server out of
service for at least one ``ttl`` and never restart a majority at once.

Timeouts. redis-py retries failed commands with backoff by default, which can stall a call to
a dead server for seconds. Every server call here is bounded by ``per_node_timeout``, but
clients should also be created with small socket timeouts and no retries -- as
``RedlockBackend.from_urls`` does -- so that a dead server fails fast and releases its
connection promptly.

Note that ``aqw.lease.Lease`` counts the lease's life as the full ``ttl`` from the moment a
request was sent; the safe validity is ``ttl - drift`` (1 % + 2 ms by default), which the
renewal interval (``ttl / 3``) leaves ample room for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

from .._redis import scripts as _scripts
from .._redis.client import Redis, client_from_url, no_retry
from .._redis.cluster import (
    hash_slot,
    is_cluster,
    is_cluster_url,
    make_cluster_client,
    same_slot_fence_key,
)
from ..errors import ConfigError

log = logging.getLogger("aqw.redlock")

__all__ = ["RedlockBackend"]


class _Failed:
    """Marks a server call that raised or timed out."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"<failed: {self.error!r}>"


_FIXED_DRIFT_MS: Final = 2


class RedlockBackend:
    """Leases held on a quorum of independent Redis servers (the Redlock algorithm).

    Implements the ``aqw.lease.LeaseBackend`` protocol: pass it to
    ``aqw.lease.Lease`` to get a Redlock lease with renewal, cancellation on loss and
    fencing tokens.

    Args:
        clients: one ``redis.asyncio.Redis`` client per server; the servers must be independent
            (not replicas of each other). Create them with small socket timeouts and no
            retries, or use ``from_urls``.
        clock_drift_factor: the fraction of the ttl reserved for clock drift between servers;
            the validity of a lease is ``ttl - elapsed - (ttl * clock_drift_factor + 2 ms)``.
        per_node_timeout: seconds each server has to answer one call before it counts as a
            failure. Keep it well below the ttl.
        fence_key: where the fencing counter of a key lives: a fixed key, a function of the
            lease key, or ``None`` for ``<key>:fence`` (the same default as
            ``aqw.lease.RedisLeaseBackend``).

    Attributes: ``clients``, ``quorum`` (``len(clients) // 2 + 1``), ``clock_drift_factor``,
    ``per_node_timeout``.
    """

    def __init__(
        self,
        clients: Sequence[Redis],
        *,
        clock_drift_factor: float = 0.01,
        per_node_timeout: float = 0.05,
        fence_key: str | Callable[[str], str] | None = None,
    ) -> None:
        if not clients:
            raise ConfigError("RedlockBackend needs at least one Redis client")
        if not 0 <= clock_drift_factor < 1:
            raise ConfigError(f"clock_drift_factor must be in [0, 1), got {clock_drift_factor!r}")
        if not per_node_timeout > 0:
            raise ConfigError(f"per_node_timeout must be > 0 seconds, got {per_node_timeout!r}")
        self.clients: tuple[Redis, ...] = tuple(clients)
        self.quorum = len(self.clients) // 2 + 1
        self.clock_drift_factor = clock_drift_factor
        self.per_node_timeout = per_node_timeout
        self._fence_key = fence_key
        self._cluster = any(is_cluster(client) for client in self.clients)
        self._acquire = _scripts.load("lease_acquire")
        self._renew = _scripts.load("lease_renew")
        self._release = _scripts.load("lease_release")

    @classmethod
    def from_urls(
        cls,
        urls: Iterable[str],
        *,
        clock_drift_factor: float = 0.01,
        per_node_timeout: float = 0.05,
        fence_key: str | Callable[[str], str] | None = None,
        **client_kwargs: Any,
    ) -> RedlockBackend:
        """A backend over one new client per URL (``redis://host:port/db``, or
        ``redis+cluster://host:port,...`` for a server that is a Redis Cluster).

        The clients fail fast: ``socket_connect_timeout=0.2``, ``socket_timeout=0.2`` and no
        retries (``retry=Retry(NoBackoff(), 0)``); ``client_kwargs`` override these and are
        passed on to ``Redis.from_url``. Close them with ``close``.
        """
        options: dict[str, Any] = {
            "socket_connect_timeout": 0.2,
            "socket_timeout": 0.2,
        }
        options.update(client_kwargs)
        clients: list[Redis] = []
        for url in urls:
            kwargs = dict(options)
            kwargs.setdefault("retry", no_retry())
            if is_cluster_url(url):  # one of the servers is a cluster (its own quorum member)
                cluster: Any = make_cluster_client(url, **kwargs)
                clients.append(cluster)
            else:
                clients.append(client_from_url(url, **kwargs))
        return cls(
            clients,
            clock_drift_factor=clock_drift_factor,
            per_node_timeout=per_node_timeout,
            fence_key=fence_key,
        )

    async def close(self) -> None:
        """Close every client (and its connection pool). Errors are logged, not raised."""
        results = await asyncio.gather(
            *(client.aclose() for client in self.clients), return_exceptions=True
        )
        for client, result in zip(self.clients, results, strict=True):
            if isinstance(result, BaseException):
                log.debug("closing %r failed: %r", client, result)

    async def __aenter__(self) -> RedlockBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def fence_key(self, key: str) -> str:
        """The key of the fencing counter of ``key`` (on every server): ``<key>:fence``, or
        when a server is a Redis Cluster one in the key's own slot (``{<key>}:fence`` for an
        untagged key; ``aqw.ConfigError`` for an untagged key holding ``}``)."""
        if self._fence_key is None:
            return same_slot_fence_key(key) if self._cluster else f"{key}:fence"
        fence = self._fence_key if isinstance(self._fence_key, str) else self._fence_key(key)
        if self._cluster and hash_slot(fence) != hash_slot(key):
            raise ConfigError(
                f"lease key {key!r} and its fencing counter {fence!r} are in different "
                "cluster slots: give both the same hash tag"
            )
        return fence

    def drift_ms(self, ttl_ms: int) -> float:
        """Milliseconds of a ``ttl_ms`` lease reserved for clock drift."""
        return ttl_ms * self.clock_drift_factor + _FIXED_DRIFT_MS

    # -- LeaseBackend ---------------------------------------------------------------------

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        """Take ``key`` for ``token`` on a quorum of servers within the validity time.

        Returns the fencing token, or ``None`` when the quorum or the validity time was not
        reached (the key is then released on every server).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        fence_key = self.fence_key(key)
        results = await self._each(
            lambda client: self._acquire(client, [key, fence_key], [token, ttl_ms])
        )
        counters: dict[int, int] = {}
        for index, result in enumerate(results):
            if result is not None and not isinstance(result, _Failed):
                counters[index] = int(result)
        fence: int | None = None
        reason = f"granted by {len(counters)}/{len(self.clients)} servers"
        if len(counters) >= self.quorum:
            fence = max(counters.values())
            synced = await self._raise_counters(fence_key, counters, fence)
            validity = self._validity_ms(ttl_ms, loop.time() - started)
            if synced < self.quorum:
                reason = f"fencing counter raised on {synced}/{len(self.clients)} servers"
                fence = None
            elif validity <= 0:
                reason = f"validity time exhausted ({validity:.1f} ms)"
                fence = None
        if fence is not None:
            return fence
        log.debug("redlock acquire of %r failed: %s; releasing everywhere", key, reason)
        await self._each(lambda client: self._release(client, [key], [token]))
        return None

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        """Extend ``key`` to ``ttl_ms`` on every server where ``token`` holds it.

        True when a quorum renewed it within the validity time; False otherwise, also when
        servers failed (the lease must then be treated as lost).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await self._each(lambda client: self._renew(client, [key], [token, ttl_ms]))
        renewed = sum(1 for result in results if not isinstance(result, _Failed) and result == 1)
        validity = self._validity_ms(ttl_ms, loop.time() - started)
        if renewed >= self.quorum and validity > 0:
            return True
        failed = [result for result in results if isinstance(result, _Failed)]
        log.warning(
            "redlock renewal of %r failed: renewed on %d/%d servers (%d errors), validity %.1f ms",
            key,
            renewed,
            len(self.clients),
            len(failed),
            validity,
        )
        return False

    async def release(self, key: str, token: str) -> bool:
        """Delete ``key`` on every server where ``token`` holds it (best effort).

        True when a quorum released it.
        """
        results = await self._each(lambda client: self._release(client, [key], [token]))
        released = sum(1 for result in results if not isinstance(result, _Failed) and result == 1)
        return released >= self.quorum

    # -- internals ------------------------------------------------------------------------

    def _validity_ms(self, ttl_ms: int, elapsed_s: float) -> float:
        return ttl_ms - elapsed_s * 1000 - self.drift_ms(ttl_ms)

    async def _call(self, client: Redis, call: Callable[[Redis], Awaitable[Any]]) -> Any:
        """One server call bounded by ``per_node_timeout``; a failure becomes ``_Failed``."""
        try:
            async with asyncio.timeout(self.per_node_timeout):
                return await call(client)
        except Exception as error:  # a dead, slow or misbehaving server is just a refusal
            log.debug("redlock call to %r failed: %r", client, error)
            return _Failed(error)

    async def _each(self, call: Callable[[Redis], Awaitable[Any]]) -> list[Any]:
        """Run ``call`` on every server concurrently; results in client order."""
        return list(await asyncio.gather(*(self._call(client, call) for client in self.clients)))

    async def _raise_counters(self, fence_key: str, counters: dict[int, int], fence: int) -> int:
        """Raise the counters behind ``fence`` to it; the number of servers now at or above.

        Only servers where this holder just took the key are touched, so no other holder
        increments those counters meanwhile; a concurrent increment would only push them higher.
        """
        behind = [index for index, value in counters.items() if value < fence]
        synced = len(counters) - len(behind)

        async def raise_one(index: int) -> Any:
            delta = fence - counters[index]
            return await self._call(
                self.clients[index],
                lambda client: client.incrby(fence_key, delta),
            )

        results = await asyncio.gather(*(raise_one(index) for index in behind))
        synced += sum(
            1 for result in results if not isinstance(result, _Failed) and int(result) >= fence
        )
        return synced
