"""The fast enqueue path: a plain enqueue stores exactly what the general path stores, a job
is encoded once, and on Redis a lone enqueue goes straight out (``enqueue_one.lua``) while
concurrent ones still share one script call (``enqueue.lua``), both storing the same."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.brokers.redis import RedisBroker
from aqw.job import Job

pytestmark = pytest.mark.timeout(60)


def test_a_job_is_encoded_once_and_a_copy_encodes_afresh() -> None:
    job = Job(task="t", payload={"a": 1}, headers={"h": "1"}, priority=3)
    wire = job.encode()
    assert job.encode() is wire  # the size check and the broker share one encoding
    assert Job.decode(wire) == job
    again = job.next_attempt()
    assert b'"attempt":2' in again.encode() and b'"attempt":1' in wire
    moved = job.model_copy(update={"id": "other"})
    assert b'"id":"other"' in moved.encode()
    plain = Job(task="t")
    assert Job.decode(plain.encode()).encode() == plain.encode()  # priority 0 left out
    assert b"priority" not in plain.encode()


async def _stored(backend: Backend, app: aqw.App, ids: list[str]) -> list[dict[str, Any]]:
    """Each job as stored: its envelope (but its id and time), size and record."""
    if backend.raw is None:
        wires = {Job.decode(d.data).id: d.data for d in await app.broker.fetch(10, 0)}
    else:
        entries: Any = await backend.raw.xrange(f"aqw:{{{backend.queue}}}:stream")
        wires = {Job.decode(f[b"j"]).id: f[b"j"] for _, f in entries}
    out = []
    for job_id in ids:
        job = Job.decode(wires[job_id])
        seen: dict[str, Any] = {
            "envelope": job.model_dump(exclude={"id", "enqueued_at"}),
            "bytes": len(wires[job_id]) - len(repr(job.enqueued_at)),  # but the time's digits
        }
        if backend.raw is None:
            info = await app.job(job_id)
            assert info is not None
            assert info.enqueued_at is not None
            assert info.enqueued_at.timestamp() == pytest.approx(job.enqueued_at)
            seen["record"] = (info.state, info.task, info.attempts)
        else:
            key = f"aqw:{{{backend.queue}}}:job:{job_id}"
            record: Any = await backend.raw.hgetall(key)
            seen["record"] = {k.decode(): v.decode() for k, v in record.items()}
            assert seen["record"].pop("enqueued_at") == repr(job.enqueued_at)
            seen["ttl_days"] = await backend.raw.pttl(key) // 86_400_000
        out.append(seen)
    return out


async def test_a_plain_enqueue_stores_what_the_general_path_stores(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="plain")
    async def plain(n: int, word: str = "x") -> None:
        return None

    fast = await plain.enqueue({"n": 1})  # no option: the plain path
    general = await plain.enqueue({"n": 1}, headers={})  # an option: the general path
    [many] = await plain.enqueue_many([{"n": 1}])
    first, second, third = await _stored(backend, app, [fast, general, many])
    assert first == second == third


async def test_a_plain_enqueue_refuses_what_the_general_path_refuses(backend: Backend) -> None:
    app = backend.app(max_payload_bytes=200)

    @app.task(name="small")
    async def small(text: str) -> None:
        return None

    with pytest.raises(aqw.PayloadTooLarge) as fast:
        await small.enqueue("x" * 300)
    with pytest.raises(aqw.PayloadTooLarge) as general:
        await small.enqueue("x" * 300, headers={})
    # The same message, but for the digits of the enqueue time the size counts.
    assert re.sub(r"\d{3} bytes", "N bytes", str(fast.value)) == re.sub(
        r"\d{3} bytes", "N bytes", str(general.value)
    )
    assert abs(fast.value.size - general.value.size) <= 2
    with pytest.raises(aqw.ConfigError, match="queue"):
        await small.enqueue("a", queue="bad queue {}")
    assert (await app.broker.depth()).waiting == 0


async def test_redis_lone_enqueues_go_straight_out_and_concurrent_ones_merge(
    redis_backend: Backend,
) -> None:
    app = redis_backend.app()
    broker = app.broker
    assert isinstance(broker, RedisBroker)
    direct, merged = 0, 0
    script, merge = broker.jobs.enqueue_one, broker.batcher.merged

    class Counting:
        async def __call__(self, *args: Any) -> Any:
            nonlocal direct
            direct += 1
            return await script(*args)

        def __getattr__(self, name: str) -> Any:
            return getattr(script, name)

    def counting_merge(*args: Any) -> Any:
        nonlocal merged
        merged += 1
        return merge(*args)

    broker.jobs.enqueue_one = Counting()  # type: ignore[assignment]
    broker.batcher.merged = counting_merge  # type: ignore[method-assign]

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    for i in range(10):
        await noop.enqueue(i)
    assert (direct, merged) == (10, 0)  # one awaited at a time: no batch to form
    direct = 0
    await asyncio.gather(*(noop.enqueue(i) for i in range(50)))
    assert direct + merged == 50
    assert 1 <= direct < 50 and merged >= 1  # the rest queued behind the first, merged
    assert (await broker.depth()).waiting == 60


async def _raw_stored(backend: Backend, ids: list[str]) -> list[dict[str, Any]]:
    """Each job as Redis holds it (the stream of its level, its record and the record's
    TTL), but its id and enqueue time."""
    assert backend.raw is not None
    tag = f"aqw:{{{backend.queue}}}"
    wires: dict[str, tuple[bytes, bytes]] = {}
    for stream in (f"{tag}:stream", f"{tag}:stream:p3"):
        entries: Any = await backend.raw.xrange(stream)
        wires.update({Job.decode(f[b"j"]).id: (stream.encode(), f[b"j"]) for _, f in entries})
    out = []
    for job_id in ids:
        stream, wire = wires[job_id]
        job = Job.decode(wire)
        record: Any = await backend.raw.hgetall(f"{tag}:job:{job_id}")
        fields = {k.decode(): v.decode() for k, v in record.items()}
        assert fields.pop("enqueued_at") == repr(job.enqueued_at)
        if job.expires_at is not None:
            assert fields.pop("expires_at") == repr(job.expires_at)
        ttl = await backend.raw.pttl(f"{tag}:job:{job_id}")
        out.append(
            {
                "stream": stream,
                "envelope": job.model_dump(exclude={"id", "enqueued_at", "expires_at"}),
                "expires": job.expires_at is not None,
                "record": fields,
                "ttl_days": ttl // 86_400_000,
            }
        )
    return out


@pytest.mark.parametrize(
    "options",
    [{}, {"expires": 3600.0}, {"priority": 3}, {"expires": 3600.0, "priority": 3}],
    ids=["plain", "expires", "priority", "both"],
)
async def test_redis_a_lone_enqueue_stores_what_a_merged_one_stores(
    redis_backend: Backend, options: dict[str, Any]
) -> None:
    app = redis_backend.app()
    broker = app.broker
    assert isinstance(broker, RedisBroker)
    lone: list[str] = []
    one = broker.jobs.enqueue_one

    class Watching:
        async def __call__(self, client: Any, keys: list[str], argv: list[Any]) -> Any:
            lone.append(Job.decode(argv[0]).id)
            return await one(client, keys, argv)

        def __getattr__(self, name: str) -> Any:
            return getattr(one, name)

    broker.jobs.enqueue_one = Watching()  # type: ignore[assignment]

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    ids = list(await asyncio.gather(*(noop.enqueue(7, **options) for _ in range(20))))
    ids += await noop.enqueue_many([7, 7], **options)  # two jobs: one enqueue.lua call
    merged = [i for i in ids if i not in lone]
    assert lone and len(merged) >= 3  # both scripts ran
    stored = await _raw_stored(redis_backend, ids)
    assert all(s == stored[0] for s in stored), stored
    first = stored[0]
    assert first["stream"].endswith(b":stream:p3" if "priority" in options else b":stream")
    assert first["expires"] == ("expires" in options)
    assert first["record"] == {"state": "queued", "task": "noop", "attempts": "0"}
    assert first["ttl_days"] >= 6  # UNFINISHED_KEEP, a week


async def test_redis_a_lone_enqueue_writes_a_fresh_record(redis_backend: Backend) -> None:
    app = redis_backend.app()
    broker = app.broker
    assert isinstance(broker, RedisBroker) and redis_backend.raw is not None
    job = Job(task="noop", payload=1)
    record = f"aqw:{{{redis_backend.queue}}}:job:{job.id}"
    await redis_backend.raw.hset(record, mapping={"state": "succeeded", "result": "1"})
    await broker.publish([job])  # the same id again: its record starts over
    fields: Any = await redis_backend.raw.hgetall(record)
    assert fields[b"state"] == b"queued" and b"result" not in fields
    info = await app.job(job.id)
    assert info is not None and info.state == "queued"
