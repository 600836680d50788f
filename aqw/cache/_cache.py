"""A Redis cache in front of a datastore: single-flight loads and versioned entries.

``Cache`` keeps copies of datastore reads in Redis and is built so that a cached copy
never silently replaces a newer one:

* **Single-flight loading.** ``Cache.get_or_load`` on a miss calls the loader in one place
  only. Concurrent calls in one process share one load; across processes, one caller takes a
  short lock (``SET lock token NX PX``) and loads while the others poll the key with jittered
  backoff until the value appears (or, after ``wait_timeout``, load by themselves).
* **Versions.** Every key has a version counter that writers bump after changing the
  datastore (``Cache.bump_version``). Each entry records the version it was loaded at.
  Stores are compare-and-set in Lua: a value with a version older than the counter or than the
  stored entry is refused. An entry older than the counter is stale and reads as a miss.
* **Invalidation.** ``Cache.invalidate`` deletes the entry and bumps the counter in one
  atomic step, so a load that began before it cannot re-insert the old value.

Values are stored as JSON: whatever the loader returns comes back from the cache (and from
the load itself) as JSON types -- ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` or
``None``. Pydantic models are stored via ``model_dump(mode="json")``; validate them again on
the way out (``Model.model_validate(value)``).

The Redis keys of one logical key share a hash tag (``<prefix>:{<key>}``,
``<prefix>:{<key>}:ver``, ``<prefix>:{<key>}:lock``), so the scripts run on Redis Cluster.
Version counters do not expire: they exist for keys that were bumped, invalidated or written
with a version, and must outlive the entries they guard.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar, cast

from .._ids import new_token
from .._redis import scripts as _scripts
from .._redis.client import Redis
from .._redis.cluster import hash_slot, is_cluster
from ..errors import ConfigError
from ._entry import (
    CacheEntry,
    CacheKeys,
    Flight,
    check_key,
    check_min_version,
    check_version,
    dumps,
    ttl_to_ms,
)

__all__ = ["Cache", "CacheEntry", "CacheEventHook"]

log = logging.getLogger("aqw.cache")

T = TypeVar("T")

CacheEventHook = Callable[[str, str], None]
"""``on_event(event, key)``, called with ``"hit"`` or ``"miss"`` and the logical key."""

_POLL_MIN = 0.005
_POLL_MAX = 0.05


class Cache:
    """Cache-aside over Redis with single-flight loads and versioned, compare-and-set entries.

    Args:
        redis: a ``redis.asyncio`` client (``decode_responses`` either way).
        prefix: prefix of every Redis key the cache writes.
        default_ttl: seconds an entry lives when no ``ttl`` is given.
        negative_ttl: when set, a loader result of ``None`` is cached as a tombstone for this
            many seconds; when ``None``, ``None`` results are not cached at all.
        lock_ttl: seconds the cross-process load lock lives. A loader that runs longer may
            see a second process load the same key.
        wait_timeout: longest time in seconds a caller waits for another process's load
            before calling the loader itself.
        on_event: optional ``on_event(event, key)`` called with ``"hit"`` or ``"miss"``; an
            exception it raises is logged and swallowed.

    Attributes:
        hits: lookups (``get`` and ``get_or_load`` calls) served from the cache.
        misses: lookups that found no usable entry.
        loads: calls of a loader made by this instance.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = "aqw:cache",
        default_ttl: float = 300.0,
        negative_ttl: float | None = None,
        lock_ttl: float = 10.0,
        wait_timeout: float = 10.0,
        on_event: CacheEventHook | None = None,
    ) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError("Cache prefix must be a non-empty string")
        self._default_ttl_ms = ttl_to_ms(default_ttl, "default_ttl")
        self._negative_ttl_ms = (
            None if negative_ttl is None else ttl_to_ms(negative_ttl, "negative_ttl")
        )
        self._lock_ttl_ms = ttl_to_ms(lock_ttl, "lock_ttl")
        if not wait_timeout >= 0:
            raise ConfigError(f"Cache wait_timeout must be >= 0 seconds, got {wait_timeout!r}")
        self.redis = redis
        self.prefix = prefix
        self.default_ttl = default_ttl
        self.negative_ttl = negative_ttl
        self.lock_ttl = lock_ttl
        self.wait_timeout = wait_timeout
        self.on_event = on_event
        self.hits = 0
        self.misses = 0
        self.loads = 0
        self._flights: dict[str, Flight] = {}
        self._get = _scripts.load("cache_get")
        self._put = _scripts.load("cache_put")
        self._invalidate = _scripts.load("cache_invalidate")
        self._unlock = _scripts.load("cache_unlock")
        self._cluster = is_cluster(redis)

    # -- reading -------------------------------------------------------------------------------

    async def get(self, key: str, min_version: int | None = None) -> CacheEntry:
        """Look ``key`` up without loading.

        An entry older than the key's version counter (a writer bumped it after the entry was
        loaded), or older than ``min_version`` (a version the caller already knows of), is
        refused and reported as a miss. Counts one hit or miss.

        Returns:
            A ``CacheEntry``; on a miss ``hit`` is False, ``value`` is None and
            ``version`` is the key's current version counter.
        """
        keys = self._keys(key)
        entry = await self._read(keys, check_min_version(min_version))
        self._record("hit" if entry.hit else "miss", key)
        return entry

    async def get_or_load(
        self,
        key: str,
        loader: Callable[[], Awaitable[T]],
        ttl: float | None = None,
        *,
        min_version: int | None = None,
    ) -> T:
        """The cached value of ``key``, loading and caching it on a miss.

        On a miss the loader runs once: concurrent calls in this process share one load, and
        across processes one caller holds a short Redis lock while the others wait for its
        result (at most ``wait_timeout`` seconds, then they load by themselves). The loading
        caller reads the key's version counter *before* calling the loader and stores the
        result at that version, so a load that raced with ``bump_version`` or
        ``invalidate`` is returned to its callers but never cached.

        A ``None`` result is cached as a tombstone only when ``negative_ttl`` is set.

        Args:
            key: the logical key (non-empty).
            loader: coroutine function reading the source of truth.
            ttl: seconds to keep the loaded value (default ``default_ttl``); the ttl of the
                call that starts a shared load applies.
            min_version: refuse a cached entry older than this version and load instead.
                Only shared in-process loads required to satisfy at least this version are
                joined.

        Returns:
            The value **as JSON types** -- also when this call ran the loader, the result is
            round-tripped through JSON, so hits and misses return the same shape (a pydantic
            model comes back as a ``dict``). The ``T`` annotation is therefore nominal.

        Raises:
            ConfigError: on an empty key, ``ttl <= 0`` or a negative ``min_version``.
            TypeError: when the loader's result is not JSON-serialisable.
            Exception: whatever the loader raises (shared by every caller of that load).
        """
        check_key(key)
        ttl_ms = self._default_ttl_ms if ttl is None else ttl_to_ms(ttl, "ttl")
        floor = check_min_version(min_version)
        flight = self._flights.get(key)
        if flight is None or flight.task is None or flight.min_version < floor:
            flight = Flight(floor)
            task = asyncio.create_task(
                self._load(key, loader, ttl_ms, flight), name=f"aqw.cache.load:{key}"
            )
            flight.task = task
            self._flights[key] = flight
            task.add_done_callback(partial(self._flight_done, key, flight))
        try:
            value = await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._record_flight(flight, key)
            raise
        self._record_flight(flight, key)
        return cast(T, value)

    async def version(self, key: str) -> int:
        """The current version counter of ``key`` (0 when it was never bumped)."""
        raw = await self.redis.get(self._keys(key).version)
        return 0 if raw is None else int(raw)

    # -- writing -------------------------------------------------------------------------------

    async def bump_version(self, key: str) -> int:
        """Mark every cached copy of ``key`` stale; call it after writing the datastore.

        The current entry (and any store still in flight with an older version) is refused
        from now on. Pass the returned version to ``put_after_write`` to write the new
        value through.

        Returns:
            The new version.
        """
        keys = self._keys(key)
        self._drop_flight(key)
        return int(await self.redis.incr(keys.version))

    async def put(
        self, key: str, value: Any, *, version: int | None = None, ttl: float | None = None
    ) -> bool:
        """Store ``value`` for ``key`` at ``version``, atomically compare-and-set.

        Refused when ``version`` is older than the key's version counter or than the stored
        entry; an equal version overwrites. A version newer than the counter raises the
        counter to it (so older entries become stale).

        Args:
            key: the logical key (non-empty).
            value: a JSON-serialisable value (pydantic models allowed).
            version: the version the value reflects -- from ``get`` (the counter on a
                miss) or ``bump_version``. ``None`` stores it at the current counter;
                use that only for a value known to reflect the latest write.
            ttl: seconds to keep it (default ``default_ttl``).

        Returns:
            True when stored, False when a newer version won.
        """
        keys = self._keys(key)
        ttl_ms = self._default_ttl_ms if ttl is None else ttl_to_ms(ttl, "ttl")
        if version is not None:
            check_version(version, "version")
        return await self._store(keys, dumps(value), version, ttl_ms)

    async def put_after_write(
        self, key: str, value: Any, version: int, *, ttl: float | None = None
    ) -> bool:
        """Write-through: cache the value just written to the datastore at ``version``.

        Call it after the datastore write and ``bump_version`` (pass the version that
        returned, or a monotonic row version from the datastore). Like ``put``, it is
        compare-and-set: a slower writer holding an older version cannot overwrite a newer
        entry.

        Returns:
            True when stored, False when a newer version is already known.
        """
        check_version(version, "version")
        return await self.put(key, value, version=version, ttl=ttl)

    async def invalidate(self, *keys: str) -> dict[str, int]:
        """Delete the entries of ``keys`` and bump their versions, each atomically in Lua.

        A load that read the old version before the invalidation cannot store its value
        afterwards. Callers already waiting on such a load in this process still receive
        its result; later calls load again.

        Returns:
            The new version of each key.
        """
        unique = list(dict.fromkeys(keys))
        all_keys = [self._keys(key) for key in unique]
        for key in unique:
            self._drop_flight(key)
        versions = await asyncio.gather(
            *(self._invalidate(self.redis, [k.entry, k.version], []) for k in all_keys)
        )
        return {key: int(v) for key, v in zip(unique, versions, strict=True)}

    # -- internals -----------------------------------------------------------------------------

    def _keys(self, key: str) -> CacheKeys:
        keys = CacheKeys.of(self.prefix, key)
        if self._cluster and hash_slot(keys.entry) != hash_slot(keys.version):
            # An empty hash tag ("{}"): Redis then hashes each whole key name.
            raise ConfigError(
                f"Cache key {key!r} with prefix {self.prefix!r} makes an empty hash tag, so "
                "its keys land in different cluster slots: keep '{}' out of the prefix and do not "
                "start the key with '}'"
            )
        return keys

    async def _read(self, keys: CacheKeys, floor: int) -> CacheEntry:
        current_raw, version_raw, data = await self._get(self.redis, [keys.entry, keys.version], [])
        current = int(current_raw)
        if version_raw is None or data is None:
            return CacheEntry(None, current, False)
        version = int(version_raw)
        if version < current or version < floor:
            return CacheEntry(None, current, False)
        return CacheEntry(json.loads(data), version, True)

    async def _store(self, keys: CacheKeys, payload: str, version: int | None, ttl_ms: int) -> bool:
        argv: list[Any] = ["" if version is None else str(version), payload, ttl_ms]
        return bool(await self._put(self.redis, [keys.entry, keys.version], argv))

    async def _load(
        self, key: str, loader: Callable[[], Awaitable[Any]], ttl_ms: int, flight: Flight
    ) -> Any:
        keys = self._keys(key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_timeout
        delay = _POLL_MIN
        while True:
            entry = await self._read(keys, flight.min_version)
            if flight.hit is None:
                flight.hit = entry.hit
            if entry.hit:
                return entry.value
            token = new_token()
            if await self.redis.set(keys.lock, token, nx=True, px=self._lock_ttl_ms):
                try:
                    # Someone may have stored the value between our read and taking the lock.
                    entry = await self._read(keys, flight.min_version)
                    if entry.hit:
                        return entry.value
                    return await self._call_loader(key, keys, loader, entry.version, ttl_ms)
                finally:
                    await self._unlock(self.redis, [keys.lock], [token])
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, _POLL_MAX)
        log.warning(
            "cache key %r: no value after waiting %.3fs for another load; loading it here",
            key,
            self.wait_timeout,
        )
        return await self._call_loader(key, keys, loader, entry.version, ttl_ms)

    async def _call_loader(
        self,
        key: str,
        keys: CacheKeys,
        loader: Callable[[], Awaitable[Any]],
        version: int,
        ttl_ms: int,
    ) -> Any:
        self.loads += 1
        value = await loader()
        if value is None and self._negative_ttl_ms is None:
            return None
        payload = dumps(value)
        if value is None and self._negative_ttl_ms is not None:
            ttl_ms = self._negative_ttl_ms  # a tombstone
        if not await self._store(keys, payload, version, ttl_ms):
            log.debug("cache key %r: value loaded at version %d is stale; not cached", key, version)
        return json.loads(payload)

    def _flight_done(self, key: str, flight: Flight, task: asyncio.Task[Any]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # retrieved: each caller re-raises it; none may be left to do so

    def _drop_flight(self, key: str) -> None:
        # Later callers must not join a load that began before this write.
        self._flights.pop(key, None)

    def _record_flight(self, flight: Flight, key: str) -> None:
        if flight.hit is not None:
            self._record("hit" if flight.hit else "miss", key)

    def _record(self, event: str, key: str) -> None:
        if event == "hit":
            self.hits += 1
        else:
            self.misses += 1
        if self.on_event is not None:
            try:
                self.on_event(event, key)
            except Exception:
                log.exception("cache on_event hook failed for %s %r", event, key)

    def __repr__(self) -> str:
        return f"Cache(prefix={self.prefix!r}, hits={self.hits}, misses={self.misses})"
