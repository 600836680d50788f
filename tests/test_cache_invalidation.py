"""Tasks that declare cache keys to invalidate: done after the job's datastore write and before
its ack, so once a job is acknowledged no reader sees the stale entry."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from redis.asyncio import Redis

import aqw
from aqw.cache import Cache
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(30)


class Rename(BaseModel):
    user_id: int
    name: str


@pytest.fixture
def prefix() -> str:
    return f"t-cache-{uuid.uuid4().hex[:8]}"


async def _cleanup(client: Redis, prefix: str) -> None:
    keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await client.delete(*keys)


@pytest.mark.parametrize("backend", ["fakeredis", "redis"], indirect=True)
async def test_no_stale_entry_is_visible_once_the_job_is_acked(
    backend: Backend, prefix: str
) -> None:
    client = backend.client()
    cache = Cache(client, prefix=prefix)
    app = backend.app(cache=cache)
    database = {1: "old name"}
    seen_at_ack: list[Any] = []

    @app.task(invalidates=["user:{user_id}"])
    async def rename(change: Rename) -> None:
        database[change.user_id] = change.name  # the datastore write

    async def load() -> str:
        return database[1]

    assert await cache.get_or_load("user:1", load) == "old name"
    assert (await cache.get("user:1")).hit

    ack = app.broker.ack

    async def ack_after_checking(*args: Any, **kwargs: Any) -> bool:
        seen_at_ack.append((await cache.get("user:1")).hit)  # what a reader sees at the ack
        return await ack(*args, **kwargs)

    app.broker.ack = ack_after_checking  # type: ignore[method-assign]
    await rename.enqueue(Rename(user_id=1, name="new name"))
    worker = app.worker(burst=True)
    await worker.run()
    try:
        assert worker.stats.processed == 1
        assert seen_at_ack == [False]  # invalidated before the ack
        assert await cache.get_or_load("user:1", load) == "new name"
    finally:
        await _cleanup(client, prefix)


@pytest.mark.parametrize("backend", ["fakeredis"], indirect=True)
async def test_keys_from_a_function_and_ctx_cache(backend: Backend, prefix: str) -> None:
    client = backend.client()
    cache = Cache(client, prefix=prefix)
    app = backend.app(cache=cache)
    seen: list[Any] = []

    @app.task(invalidates=lambda ids: [f"item:{i}" for i in ids])
    async def touch(ids: list[int], ctx: aqw.Context) -> None:
        seen.append(ctx.cache is cache)

    for i in (1, 2, 3):
        await cache.put(f"item:{i}", i)
    await touch.enqueue([1, 3])
    await app.worker(burst=True).run()
    assert seen == [True]
    hits = [(await cache.get(f"item:{i}")).hit for i in (1, 2, 3)]
    assert hits == [False, True, False]


@pytest.mark.parametrize("backend", ["fakeredis", "redis"], indirect=True)
async def test_a_failed_invalidation_is_not_acknowledged(backend: Backend, prefix: str) -> None:
    client = backend.client()
    cache = Cache(client, prefix=prefix)
    app = backend.app(cache=cache, retry=aqw.RetryPolicy(max_retries=1, base=0.01, cap=0.01))
    runs = 0

    @app.task(invalidates=["user:{user_id}"])
    async def rename(change: Rename) -> None:
        nonlocal runs
        runs += 1

    failures = 1

    real = cache.invalidate

    async def flaky(*keys: str) -> dict[str, int]:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("cache unreachable")
        return await real(*keys)

    cache.invalidate = flaky  # type: ignore[method-assign]
    await rename.enqueue(Rename(user_id=7, name="x"))
    worker = app.worker(burst=True)
    await worker.run()
    assert runs == 2  # the job ran again instead of being acked with a stale cache
    assert (worker.stats.retried, worker.stats.processed) == (1, 1)
    await _cleanup(client, prefix)


def test_invalidates_needs_a_cache() -> None:
    app = aqw.App("memory://inv")
    with pytest.raises(aqw.ConfigError, match="invalidates= needs a cache"):

        @app.task(invalidates=["k"])
        async def job() -> None:
            return None
