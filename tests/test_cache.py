"""Tests of aqw.cache.Cache, each run on fakeredis and on the real Redis (AQW_TEST_REDIS_URL).

Real-Redis tests use db 0 with a random key prefix per test and delete their keys afterwards.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import fakeredis
import pytest
from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from aqw.cache import Cache, CacheEntry
from aqw.errors import ConfigError
from tests._helpers import REDIS_URL, ttl_agrees

ClientFactory = Callable[..., Redis]

FACTORY = pytest.StashKey[ClientFactory]()
PREFIX = pytest.StashKey[str]()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.redis)])
async def redis_client(request: pytest.FixtureRequest) -> AsyncIterator[Redis]:
    """A client of a fresh fakeredis server, or of the real Redis (keys under a random prefix)."""
    prefix = f"aqwtest:{uuid.uuid4().hex}:cache"
    clients: list[Redis] = []
    server = fakeredis.FakeServer() if request.param == "fake" else None

    def factory(**kwargs: Any) -> Redis:
        client: Redis
        if server is not None:
            client = fakeredis.FakeAsyncRedis(server=server, **kwargs)
        else:
            client = Redis.from_url(REDIS_URL, **kwargs)
        clients.append(client)
        return client

    request.node.stash[FACTORY] = factory
    request.node.stash[PREFIX] = prefix
    client = factory()
    try:
        if server is None:
            try:
                await client.ping()
            except (RedisConnectionError, OSError) as exc:
                pytest.fail(f"no Redis at {REDIS_URL} (CI starts one): {exc}")
        yield client
    finally:
        if server is None:
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await client.delete(*keys)
        for c in clients:
            await c.aclose()


@pytest.fixture
def prefix(request: pytest.FixtureRequest, redis_client: Redis) -> str:
    return request.node.stash[PREFIX]


@pytest.fixture
def new_client(request: pytest.FixtureRequest, redis_client: Redis) -> ClientFactory:
    """Another client of the same server as ``redis_client`` (a simulated separate worker)."""
    return request.node.stash[FACTORY]


@pytest.fixture
def make_cache(redis_client: Redis, prefix: str) -> Callable[..., Cache]:
    def make(client: Redis | None = None, **kwargs: Any) -> Cache:
        return Cache(redis_client if client is None else client, prefix=prefix, **kwargs)

    return make


@pytest.fixture
def cache(make_cache: Callable[..., Cache]) -> Cache:
    return make_cache()


class Counter:
    """A loader that counts its calls, optionally sleeping or waiting for a gate."""

    def __init__(
        self, value: Any = "loaded", *, delay: float = 0.0, gate: asyncio.Event | None = None
    ) -> None:
        self.value = value
        self.delay = delay
        self.gate = gate
        self.calls = 0
        self.started = asyncio.Event()

    async def __call__(self) -> Any:
        self.calls += 1
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.value


# -- basics ------------------------------------------------------------------------------------


async def test_put_get_roundtrip_and_hash_tagged_keys(
    cache: Cache, redis_client: Redis, prefix: str
) -> None:
    assert await cache.get("user:1") == CacheEntry(None, 0, False)
    put_at = time.monotonic()
    assert await cache.put("user:1", {"name": "ann", "tags": ("a", "b")}) is True
    assert await cache.get("user:1") == CacheEntry({"name": "ann", "tags": ["a", "b"]}, 0, True)
    entry_key = f"{prefix}:{{user:1}}"
    assert await redis_client.exists(entry_key) == 1
    assert await redis_client.hgetall(entry_key) == {
        b"v": b"0",
        b"d": b'{"name":"ann","tags":["a","b"]}',
    }
    assert ttl_agrees(await redis_client.pttl(entry_key), 300_000, since=put_at)
    assert await cache.bump_version("user:1") == 1
    assert await redis_client.get(f"{prefix}:{{user:1}}:ver") == b"1"
    assert await cache.version("user:1") == 1


async def test_works_with_decode_responses(new_client: ClientFactory, prefix: str) -> None:
    cache = Cache(new_client(decode_responses=True), prefix=prefix)
    assert await cache.put("k", [1, "x"], version=2) is True
    assert await cache.get("k") == CacheEntry([1, "x"], 2, True)
    assert await cache.get_or_load("k", Counter()) == [1, "x"]
    assert await cache.invalidate("k") == {"k": 3}


# -- versions ----------------------------------------------------------------------------------


async def test_stale_writer_cannot_overwrite_newer_entry(cache: Cache) -> None:
    v1 = await cache.bump_version("acct")
    v2 = await cache.bump_version("acct")
    assert (v1, v2) == (1, 2)
    # The newer writer lands first; the slower writer with the older version arrives later.
    assert await cache.put_after_write("acct", {"balance": 20}, v2) is True
    assert await cache.put_after_write("acct", {"balance": 10}, v1) is False
    assert await cache.put("acct", {"balance": 10}, version=v1) is False
    assert await cache.get("acct") == CacheEntry({"balance": 20}, 2, True)
    # Same version may overwrite (same write), a newer one wins and raises the counter.
    assert await cache.put("acct", {"balance": 21}, version=2) is True
    assert await cache.put("acct", {"balance": 30}, version=5) is True
    assert await cache.version("acct") == 5
    assert await cache.put("acct", {"balance": 21}, version=4) is False
    assert await cache.get("acct") == CacheEntry({"balance": 30}, 5, True)


async def test_writer_older_than_version_counter_is_refused(cache: Cache) -> None:
    await cache.bump_version("k")
    await cache.bump_version("k")
    # No entry at all, but the counter says version 2 exists: a version-1 value is stale.
    assert await cache.put("k", "old", version=1) is False
    assert await cache.get("k") == CacheEntry(None, 2, False)
    assert await cache.put("k", "cur", version=2) is True
    assert await cache.get("k") == CacheEntry("cur", 2, True)


async def test_stored_version_guards_even_without_the_counter(
    cache: Cache, redis_client: Redis
) -> None:
    assert await cache.put("k", "v5", version=5) is True
    await redis_client.delete(f"{cache.prefix}:{{k}}:ver")  # counter lost (e.g. evicted)
    assert await cache.put("k", "v3", version=3) is False
    assert await cache.get("k") == CacheEntry("v5", 5, True)


async def test_bump_makes_existing_entry_stale(cache: Cache) -> None:
    assert await cache.put("k", "v0", version=0) is True
    assert (await cache.get("k")).hit is True
    assert await cache.bump_version("k") == 1
    assert await cache.get("k") == CacheEntry(None, 1, False)
    loader = Counter("v1")
    assert await cache.get_or_load("k", loader) == "v1"
    assert loader.calls == 1
    assert await cache.get("k") == CacheEntry("v1", 1, True)


async def test_load_racing_with_a_bump_is_returned_but_not_cached(cache: Cache) -> None:
    async def loader() -> str:
        # A writer changes the datastore and bumps while this (now stale) load runs.
        await cache.bump_version("k")
        return "stale"

    assert await cache.get_or_load("k", loader) == "stale"
    assert await cache.get("k") == CacheEntry(None, 1, False)
    fresh = Counter("fresh")
    assert await cache.get_or_load("k", fresh) == "fresh"
    assert fresh.calls == 1
    assert await cache.get("k") == CacheEntry("fresh", 1, True)


async def test_min_version_refuses_old_entries(cache: Cache) -> None:
    v = await cache.bump_version("k")
    assert await cache.put_after_write("k", "at-1", v) is True
    assert await cache.get("k", min_version=1) == CacheEntry("at-1", 1, True)
    assert await cache.get("k", min_version=0) == CacheEntry("at-1", 1, True)
    # The reader knows version 2 exists (e.g. it just wrote it): the version-1 entry is refused.
    assert await cache.get("k", min_version=2) == CacheEntry(None, 1, False)

    satisfied = Counter("unused")
    assert await cache.get_or_load("k", satisfied, min_version=1) == "at-1"
    assert satisfied.calls == 0
    refused = Counter("reloaded")
    assert await cache.get_or_load("k", refused, min_version=2) == "reloaded"
    assert refused.calls == 1


async def test_min_version_does_not_join_an_older_in_process_load(cache: Cache) -> None:
    gate = asyncio.Event()
    first = Counter("first", gate=gate)
    t1 = asyncio.create_task(cache.get_or_load("k", first))
    await first.started.wait()
    joiner = Counter("joiner")
    t2 = asyncio.create_task(cache.get_or_load("k", joiner))  # joins the running load
    demanding = Counter("demanding")
    t3 = asyncio.create_task(cache.get_or_load("k", demanding, min_version=1))
    await asyncio.sleep(0.02)
    gate.set()
    assert await asyncio.gather(t1, t2, t3) == ["first", "first", "demanding"]
    assert (first.calls, joiner.calls, demanding.calls) == (1, 0, 1)


# -- single flight -----------------------------------------------------------------------------


async def test_100_concurrent_calls_load_once(cache: Cache, redis_client: Redis) -> None:
    loader = Counter({"v": 1}, delay=0.05)
    results = await asyncio.gather(*(cache.get_or_load("cold", loader) for _ in range(100)))
    assert results == [{"v": 1}] * 100
    assert loader.calls == 1
    assert cache.loads == 1
    assert (cache.hits, cache.misses) == (0, 100)
    assert await cache.get_or_load("cold", loader) == {"v": 1}
    assert loader.calls == 1
    assert (cache.hits, cache.misses) == (1, 100)
    assert await redis_client.exists(f"{cache.prefix}:{{cold}}:lock") == 0


async def test_100_concurrent_calls_across_3_workers_load_once(
    make_cache: Callable[..., Cache], new_client: ClientFactory, redis_client: Redis
) -> None:
    workers = [make_cache(new_client()) for _ in range(3)]
    loader = Counter([1, 2, 3], delay=0.1)
    results = await asyncio.gather(
        *(workers[i % 3].get_or_load("cold", loader) for i in range(100))
    )
    assert results == [[1, 2, 3]] * 100
    assert loader.calls == 1
    assert sum(w.loads for w in workers) == 1
    assert sum(w.misses for w in workers) == 100
    assert sum(w.hits for w in workers) == 0
    assert await redis_client.exists(f"{workers[0].prefix}:{{cold}}:lock") == 0


async def test_value_stored_before_the_lock_was_taken_is_not_loaded_again(
    make_cache: Callable[..., Cache], new_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = make_cache()
    other = make_cache(new_client())
    real_read = cache._read
    reads = 0

    async def read_then_other_worker_stores(*args: Any) -> CacheEntry:
        nonlocal reads
        reads += 1
        entry = await real_read(*args)
        if reads == 1:  # another worker finishes its load right after our miss
            assert await other.put("k", "theirs") is True
        return entry

    monkeypatch.setattr(cache, "_read", read_then_other_worker_stores)
    loader = Counter("mine")
    assert await cache.get_or_load("k", loader) == "theirs"
    assert loader.calls == 0
    assert (cache.hits, cache.misses) == (0, 1)


async def test_waiter_loads_itself_after_wait_timeout(
    make_cache: Callable[..., Cache], redis_client: Redis, prefix: str
) -> None:
    lock_key = f"{prefix}:{{k}}:lock"
    await redis_client.set(lock_key, "someone-else", px=10_000)  # a stuck holder
    wait_timeout = 0.2
    cache = make_cache(wait_timeout=wait_timeout)
    loader = Counter("mine")
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await cache.get_or_load("k", loader) == "mine"
    # it waited its wait_timeout, not for the stuck holder's lock (10 s) to expire
    assert wait_timeout <= loop.time() - start
    assert await redis_client.get(lock_key) == b"someone-else"
    assert loader.calls == 1
    assert await cache.get("k") == CacheEntry("mine", 0, True)
    assert await redis_client.get(lock_key) == b"someone-else"  # never released by a non-owner


async def test_loader_error_is_shared_and_nothing_cached(cache: Cache, redis_client: Redis) -> None:
    calls = 0

    async def failing() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.02)
        raise RuntimeError("datastore down")

    results = await asyncio.gather(
        *(cache.get_or_load("k", failing) for _ in range(10)), return_exceptions=True
    )
    assert calls == 1
    assert all(isinstance(r, RuntimeError) and str(r) == "datastore down" for r in results)
    assert cache.misses == 10
    assert await redis_client.exists(f"{cache.prefix}:{{k}}:lock") == 0
    assert (await cache.get("k")).hit is False
    assert await cache.get_or_load("k", Counter("ok")) == "ok"


# -- invalidation ------------------------------------------------------------------------------


async def test_invalidate_removes_entries_and_bumps_versions(cache: Cache) -> None:
    assert await cache.put("a", 1) is True
    assert await cache.put("b", 2) is True
    await cache.bump_version("b")
    assert await cache.invalidate("a", "b", "a") == {"a": 1, "b": 2}
    assert await cache.get("a") == CacheEntry(None, 1, False)
    assert await cache.get("b") == CacheEntry(None, 2, False)
    assert await cache.invalidate() == {}


async def test_load_started_before_invalidate_cannot_reinsert_stale_value(
    make_cache: Callable[..., Cache], new_client: ClientFactory
) -> None:
    reader = make_cache()
    writer = make_cache(new_client())  # another worker
    gate = asyncio.Event()
    stale = Counter("old", gate=gate)
    task = asyncio.create_task(reader.get_or_load("k", stale))
    await stale.started.wait()  # the load read version 0 and is now reading the datastore
    assert await writer.invalidate("k") == {"k": 1}
    gate.set()
    assert await task == "old"  # its caller gets what it loaded...
    assert await writer.get("k") == CacheEntry(None, 1, False)  # ...but it is not cached
    fresh = Counter("new")
    assert await writer.get_or_load("k", fresh) == "new"
    assert fresh.calls == 1
    assert await reader.get("k") == CacheEntry("new", 1, True)


async def test_invalidate_in_process_detaches_the_running_load(cache: Cache) -> None:
    gate = asyncio.Event()
    stale = Counter("old", gate=gate)
    t1 = asyncio.create_task(cache.get_or_load("k", stale))
    await stale.started.wait()
    await cache.invalidate("k")
    fresh = Counter("new")
    t2 = asyncio.create_task(cache.get_or_load("k", fresh))  # must not join the stale load
    await asyncio.sleep(0.02)
    gate.set()
    assert await asyncio.gather(t1, t2) == ["old", "new"]
    assert (stale.calls, fresh.calls) == (1, 1)
    assert await cache.get("k") == CacheEntry("new", 1, True)


# -- negative caching, TTLs, counters ----------------------------------------------------------


async def test_negative_caching_stores_a_tombstone(
    make_cache: Callable[..., Cache], redis_client: Redis
) -> None:
    cache = make_cache(negative_ttl=5)  # long enough to outlive any load: expired by hand
    loader = Counter(None)
    loaded_at = time.monotonic()
    assert await cache.get_or_load("missing", loader) is None
    assert await cache.get_or_load("missing", loader) is None
    assert loader.calls == 1
    assert (cache.hits, cache.misses) == (1, 1)
    assert await cache.get("missing") == CacheEntry(None, 0, True)
    tombstone = f"{cache.prefix}:{{missing}}"
    assert ttl_agrees(await redis_client.pttl(tombstone), 5000, since=loaded_at)
    await redis_client.pexpire(tombstone, 1)  # as if its 5 s had passed
    await asyncio.sleep(0.01)
    assert await cache.get_or_load("missing", loader) is None
    assert loader.calls == 2


async def test_none_is_not_cached_without_negative_ttl(cache: Cache) -> None:
    loader = Counter(None)
    assert await cache.get_or_load("missing", loader) is None
    assert await cache.get_or_load("missing", loader) is None
    assert loader.calls == 2
    assert await cache.get("missing") == CacheEntry(None, 0, False)


async def test_hit_and_miss_counts_and_events(make_cache: Callable[..., Cache]) -> None:
    events: list[tuple[str, str]] = []
    cache = make_cache(on_event=lambda event, key: events.append((event, key)))
    assert (cache.hits, cache.misses) == (0, 0)
    await cache.get("k")
    await cache.get_or_load("k", Counter(1))
    await cache.get_or_load("k", Counter(2))
    await cache.get("k")
    await cache.get("other")
    assert (cache.hits, cache.misses, cache.loads) == (2, 3, 1)
    assert events == [("miss", "k"), ("miss", "k"), ("hit", "k"), ("hit", "k"), ("miss", "other")]


async def test_failing_event_hook_does_not_break_lookups(
    make_cache: Callable[..., Cache], caplog: pytest.LogCaptureFixture
) -> None:
    def hook(event: str, key: str) -> None:
        raise ValueError("telemetry broke")

    cache = make_cache(on_event=hook)
    assert await cache.get_or_load("k", Counter(7)) == 7
    assert (cache.hits, cache.misses) == (0, 1)
    assert "on_event hook failed" in caplog.text


async def test_ttl_expiry(cache: Cache, redis_client: Redis) -> None:
    # TTLs long enough to outlive any load, checked as set, then made to pass by hand.
    put_at = time.monotonic()
    assert await cache.put("k", "short", ttl=5) is True
    assert ttl_agrees(await redis_client.pttl(f"{cache.prefix}:{{k}}"), 5000, since=put_at)
    assert await cache.get("k") == CacheEntry("short", 0, True)
    loader = Counter("loaded")
    loaded_at = time.monotonic()
    assert await cache.get_or_load("j", loader, ttl=5) == "loaded"
    assert await cache.get_or_load("j", loader, ttl=5) == "loaded"
    assert loader.calls == 1
    assert ttl_agrees(await redis_client.pttl(f"{cache.prefix}:{{j}}"), 5000, since=loaded_at)
    for key in ("k", "j"):
        await redis_client.pexpire(f"{cache.prefix}:{{{key}}}", 1)
    await asyncio.sleep(0.01)
    assert await cache.get("k") == CacheEntry(None, 0, False)
    assert await cache.get_or_load("j", loader, ttl=5) == "loaded"
    assert loader.calls == 2


# -- serialisation -----------------------------------------------------------------------------


class User(BaseModel):
    id: int
    name: str
    joined: dt.date


async def test_values_come_back_as_json_types(cache: Cache) -> None:
    user = User(id=7, name="ann", joined=dt.date(2024, 1, 2))
    as_json = {"id": 7, "name": "ann", "joined": "2024-01-02"}
    loader = Counter(user)
    assert await cache.get_or_load("user", loader) == as_json  # the loading call too
    assert await cache.get_or_load("user", loader) == as_json
    assert loader.calls == 1
    assert User.model_validate(await cache.get_or_load("user", loader)) == user
    assert await cache.put("nested", {"users": [user], "at": (1, 2)}) is True
    assert (await cache.get("nested")).value == {"users": [as_json], "at": [1, 2]}
    with pytest.raises(TypeError, match="JSON-serialisable"):
        await cache.put("bad", object())


# -- argument checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"default_ttl": 0}, "default_ttl"),
        ({"default_ttl": -1.0}, "default_ttl"),
        ({"default_ttl": float("inf")}, "default_ttl"),
        ({"negative_ttl": 0}, "negative_ttl"),
        ({"lock_ttl": -5}, "lock_ttl"),
        ({"wait_timeout": -0.1}, "wait_timeout"),
        ({"prefix": ""}, "prefix"),
    ],
)
async def test_bad_constructor_arguments(
    redis_client: Redis, kwargs: dict[str, Any], name: str
) -> None:
    with pytest.raises(ConfigError, match=name):
        Cache(redis_client, **kwargs)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda c: c.get_or_load("k", Counter(), ttl=0), "ttl"),
        (lambda c: c.get_or_load("k", Counter(), ttl=-2), "ttl"),
        (lambda c: c.put("k", 1, ttl=0), "ttl"),
        (lambda c: c.put_after_write("k", 1, 1, ttl=-1), "ttl"),
        (lambda c: c.put("k", 1, version=-1), "version"),
        (lambda c: c.get("k", min_version=-1), "min_version"),
        (lambda c: c.get_or_load("k", Counter(), min_version=-1), "min_version"),
        (lambda c: c.get_or_load("", Counter()), "key"),
        (lambda c: c.get(""), "key"),
        (lambda c: c.put("", 1), "key"),
        (lambda c: c.put_after_write("", 1, 1), "key"),
        (lambda c: c.bump_version(""), "key"),
        (lambda c: c.version(""), "key"),
        (lambda c: c.invalidate("a", ""), "key"),
    ],
)
async def test_bad_call_arguments(
    cache: Cache, redis_client: Redis, call: Callable[[Cache], Awaitable[Any]], name: str
) -> None:
    with pytest.raises(ConfigError, match=name):
        await call(cache)
    assert [k async for k in redis_client.scan_iter(match=f"{cache.prefix}:*", count=1000)] == []
