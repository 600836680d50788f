"""Batches and flows on SQS with a ``records=redis://`` store (``aqw.brokers.sqs._batches``),
against moto in server mode through the real aioboto3 client and the real runtime: each
child counted once in the store's step at its settle, before its delete (a child whose
delete failed is received again, runs again and counts nothing), the callback decided once
in the count's step and sent from the store's outbox (a send that did not happen is made by
the next worker to start); kept results (``keep_result``) and a flow with edges, their
final records in the store, read by a producer of its own; keep_result still refused in
one line without a store, and batches refused in one line without a store. The same batches
with ``records=postgresql://`` (the real PostgreSQL): counted once per child (also when two
holders settle it at once), nested and empty batches, flows with edges refused in one line
before anything is written."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aioboto3  # noqa: F401 - the sqs extra must be installed for these tests
import asyncpg
import pytest
import redis.asyncio as redis
from pydantic import BaseModel

import aqw
from aqw.brokers.batching import BATCH_HEADER, callback_key
from aqw.brokers.sqs._batches import StoreBatchCounts
from aqw.job import Job
from tests._helpers import PG_DSNS, eventually, redis_url_db, run_burst

from .conftest import AppFactory, SQSKit, broker_of

until = functools.partial(eventually, interval=0.05)

#: The Redis database of the store here (14: the keys tests'; they use queues of their own).
REDIS_DB = 14

pytestmark = pytest.mark.timeout(90)


class Image(BaseModel):
    id: int


@pytest.fixture
def queue() -> str:
    return f"b{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(queue: str) -> AsyncIterator[redis.Redis]:
    """The store's Redis (the real one); the queue's keys are removed afterwards."""
    probe = redis.Redis.from_url(redis_url_db(REDIS_DB))
    await probe.ping()
    try:
        yield probe
    finally:
        found = [k async for k in probe.scan_iter(match=f"aqw:{{{queue}}}:*", count=1000)]
        if found:
            await probe.delete(*found)
        await probe.aclose()


async def _app(
    sqs: SQSKit, new_app: AppFactory, queue: str, visibility: int = 30, **options: Any
) -> aqw.App:
    await sqs.create(queue, dead=f"{queue}-dead", visibility=visibility)
    url = sqs.url(queue, dlq=f"{queue}-dead", records=redis_url_db(REDIS_DB))
    return new_app(url, queue=queue, **options)


async def test_a_batch_counts_each_child_once_and_sends_each_callback_once(
    sqs: SQSKit, new_app: AppFactory, queue: str, store: redis.Redis
) -> None:
    app = await _app(sqs, new_app, queue)
    seen: list[aqw.BatchInfo] = []
    ran: list[str] = []

    @app.task(max_retries=0)
    async def resize(image: Image, ctx: aqw.Context) -> int:
        ran.append(ctx.job_id)
        if image.id == 3:
            raise ValueError("bad image")
        return image.id

    @app.task
    async def summary(ctx: aqw.Context) -> None:
        assert ctx.batch is not None
        seen.append(ctx.batch)

    async with app.batch(on_complete=summary, on_failure=summary) as batch:
        await batch.enqueue_many(resize, [Image(id=i) for i in range(12)])
    assert batch.info is not None and batch.info.state == "sealed"
    await run_burst(app, within=60, concurrency=8)
    await until(lambda: len(seen) >= 2, 30, "both callbacks")
    await run_burst(app, within=30)  # nothing more comes: each callback was sent once
    info = await app.batch_info(batch.id)
    assert info is not None and info.state == "complete"
    assert (info.total, info.succeeded, info.failed, info.pending) == (12, 11, 1, 0)
    assert sorted(info.callbacks) == ["complete", "failure"]
    assert len(seen) == 2 and {s.succeeded for s in seen} == {11}
    assert len(ran) == 12
    assert await store.xlen(f"aqw:{{{queue}}}:sqs-outbox") == 0
    for kind in ("complete", "failure"):  # each callback's key names its one job
        key = f"aqw:{{{queue}}}:key:{callback_key(batch.id, kind)}"
        assert (await store.get(key)).decode() == info.callbacks[kind]


async def test_a_child_received_again_after_its_count_counts_nothing(
    sqs: SQSKit, new_app: AppFactory, queue: str, store: redis.Redis
) -> None:
    """The count comes before SQS's delete: a worker that dies between the two (here: the
    delete fails) leaves the message to be received again; it runs again, and its second
    settle counts nothing (membership, not a counter)."""
    app = await _app(sqs, new_app, queue, visibility=2, lease_ttl=2.0)  # back in ~2 s
    ran: Counter[int] = Counter()
    done: list[aqw.BatchInfo] = []

    @app.task
    async def resize(image: Image) -> None:
        ran[image.id] += 1

    @app.task
    async def summary(ctx: aqw.Context) -> None:
        assert ctx.batch is not None
        done.append(ctx.batch)

    broker = broker_of(app)
    connection = broker._connection
    real_delete = connection.delete
    failed: list[str] = []

    async def delete_once_refused(receipt: str, url: str) -> bool:
        if not failed:  # the first delete: as if the worker died right after the count
            failed.append(receipt)
            return False
        return await real_delete(receipt, url)

    connection.delete = delete_once_refused  # type: ignore[method-assign]
    async with app.batch(on_complete=summary) as batch:
        await batch.enqueue_many(resize, [Image(id=i) for i in range(5)])
    async with app.worker(concurrency=2):
        await until(lambda: sum(ran.values()) >= 6 and done, 60, "a child run twice, the callback")
    assert failed and max(ran.values()) >= 2 and sorted(ran) == list(range(5))  # one ran again
    info = await app.batch_info(batch.id)
    assert info is not None
    assert (info.state, info.total, info.succeeded, info.pending) == ("complete", 5, 5, 0)
    assert len(done) == 1 and done[0].succeeded == 5


async def test_a_callback_not_sent_after_its_count_is_sent_by_the_next_worker(
    sqs: SQSKit, new_app: AppFactory, queue: str, store: redis.Redis, monkeypatch: Any
) -> None:
    """The completing count puts the callback in the store's outbox in its own step; a
    worker that dies before sending it (here: the send is skipped) leaves it there, and the
    next worker to start sends it: one callback job, run once."""
    app = await _app(sqs, new_app, queue)
    done: list[str] = []

    @app.task
    async def resize(image: Image) -> None: ...

    @app.task
    async def summary(ctx: aqw.Context) -> None:
        done.append(ctx.job_id)

    async with app.batch(on_complete=summary) as batch:
        await batch.enqueue_many(resize, [Image(id=i) for i in range(3)])

    async def no_flush(self: StoreBatchCounts) -> None: ...

    with monkeypatch.context() as patch:
        patch.setattr(StoreBatchCounts, "flush", no_flush)
        await run_burst(app, within=60)
    info = await app.batch_info(batch.id)
    assert info is not None and info.state == "complete" and not done
    assert await store.xlen(f"aqw:{{{queue}}}:sqs-outbox") == 1  # decided, not yet sent
    await run_burst(app, within=60)  # its start sends the outbox
    assert done == [info.callbacks["complete"]]
    assert await store.xlen(f"aqw:{{{queue}}}:sqs-outbox") == 0


async def test_keep_result_is_read_by_another_process_from_the_store(
    sqs: SQSKit, new_app: AppFactory, queue: str, store: redis.Redis
) -> None:
    """With ``records=redis://`` a worker writes the final record of a task that keeps
    results into the store before its delete: a producer with a broker of its own (another
    process: its records never saw the job run) reads the result, and the dead job's
    error; a job of a task that keeps no result is not written there."""
    worker_app = await _app(sqs, new_app, queue)
    producer = new_app(sqs.url(queue, dlq=f"{queue}-dead", records=redis_url_db(REDIS_DB)))

    for app in (worker_app, producer):  # the same tasks, registered in each "process"

        @app.task(name="double", keep_result=True, max_retries=0)
        async def double(n: int) -> int:
            if n < 0:
                raise ValueError(f"negative {n}")
            return n * 2

        @app.task(name="plain")
        async def plain(n: int) -> None: ...

    (ok,) = await producer.enqueue("double", [21])
    (bad,) = await producer.enqueue("double", [-1])
    (other,) = await producer.enqueue("plain", [1])
    waiting = asyncio.ensure_future(producer.result(ok, timeout=60))
    await run_burst(worker_app, within=60, concurrency=4)
    assert await waiting == 42  # woken by the store's record, not by this process
    assert await producer.result(ok, timeout=5) == 42
    with pytest.raises(aqw.JobFailed, match="negative -1"):
        await producer.result(bad, timeout=5)
    info = await producer.job(bad)
    assert info is not None and info.state == "dead" and info.attempts == 1
    assert await store.exists(f"aqw:{{{queue}}}:job:{ok}", f"aqw:{{{queue}}}:job:{bad}") == 2
    assert not await store.exists(f"aqw:{{{queue}}}:job:{other}")  # nothing kept: not paid
    queued = await producer.job(other)  # only this process's own record of it
    assert queued is not None and queued.state == "queued"


async def test_a_flow_with_edges_runs_with_its_results_in_the_store(
    sqs: SQSKit, new_app: AppFactory, queue: str, store: redis.Redis
) -> None:
    """A flow's parents keep their results in the store (their count's step reads them as
    the next step's input): a chain and a fan-in run, each step once, the last step's
    result read by a producer whose broker never saw the steps run."""
    worker_app = await _app(sqs, new_app, queue)
    producer = new_app(sqs.url(queue, dlq=f"{queue}-dead", records=redis_url_db(REDIS_DB)))
    ran: Counter[str] = Counter()
    tasks: dict[str, Any] = {}

    for app in (worker_app, producer):

        @app.task(name="fetch", keep_result=True)
        async def fetch(n: int) -> int:
            ran["fetch"] += 1
            return n

        @app.task(name="square", keep_result=True)
        async def square(x: int) -> int:
            ran["square"] += 1
            return x * x

        @app.task(name="total", keep_result=True)
        async def total(parts: dict[str, int]) -> int:
            ran["total"] += 1
            return sum(parts.values())

        tasks = {"fetch": fetch, "square": square, "total": total}

    flow = aqw.Flow()
    a = flow.add(tasks["fetch"], 4, name="a")
    b = flow.add(tasks["fetch"], 3, name="b")
    sq = flow.add(tasks["square"], after=a, name="sq")
    flow.add(tasks["total"], after=[sq, b], name="total")
    handle = await producer.start(flow)
    async with worker_app.worker(concurrency=4):
        assert await handle.result(timeout=60) == 19  # 4*4 + 3
    info = await producer.flow_info(handle.id)
    assert info is not None and info.state == "complete"
    assert {s.name: s.state for s in info.steps.values()} == dict.fromkeys(
        ("a", "b", "sq", "total"), "succeeded"
    )
    assert ran == {"fetch": 2, "square": 1, "total": 1}


async def test_keep_result_without_a_store_is_still_refused_in_one_line(
    sqs: SQSKit, new_app: AppFactory, queue: str
) -> None:
    await sqs.create(queue, dead=f"{queue}-dead")
    app = new_app(sqs.url(queue, dlq=f"{queue}-dead"), queue=queue)

    @app.task(keep_result=True)
    async def fetch() -> int:
        return 4

    with pytest.raises(aqw.ConfigError, match="keep_result needs job records shared") as no:
        await run_burst(app, within=30)
    assert "\n" not in str(no.value) and "records=redis://" in str(no.value)


async def test_without_a_store_batches_are_refused_in_one_line(
    sqs: SQSKit, new_app: AppFactory, queue: str
) -> None:
    await sqs.create(queue)
    app = new_app(sqs.url(queue), queue=queue)

    @app.task
    async def step() -> None: ...

    assert app.broker.batches is None
    with pytest.raises(aqw.ConfigError, match="SQS with records=redis://"):
        app.batch()
    flow = aqw.Flow()
    flow.add(step)
    with pytest.raises(aqw.ConfigError, match="keeps no batch counts"):
        await app.start(flow)


# -- records=postgresql:// ----------------------------------------------------------------------


async def _pg_app(sqs: SQSKit, new_app: AppFactory, queue: str, **options: Any) -> aqw.App:
    await sqs.create(queue, dead=f"{queue}-dead", visibility=options.pop("visibility", 30))
    return new_app(sqs.url(queue, dlq=f"{queue}-dead", records=PG_DSNS[0]), queue=queue, **options)


@pytest.fixture
async def pg_rows(queue: str) -> AsyncIterator[asyncpg.Connection]:
    """The real PostgreSQL; this queue's rows of the batch tables are removed afterwards."""
    conn = await asyncpg.connect(PG_DSNS[0])
    try:
        yield conn
    finally:
        for table in ("batches", "batch_members", "batch_callbacks", "outbox", ""):
            name = f"aqw_sqs_keys_{table}".rstrip("_")
            if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name):
                await conn.execute(f"DELETE FROM {name} WHERE queue = $1", queue)
        await conn.close()


async def test_postgres_a_batch_counts_each_child_once_and_sends_each_callback_once(
    sqs: SQSKit, new_app: AppFactory, queue: str, pg_rows: asyncpg.Connection
) -> None:
    """The same batch as on Redis, counted in PostgreSQL: one transaction per count, the
    callbacks decided once in the completing one (their keys in the keys' table) and sent
    from the outbox table."""
    app = await _pg_app(sqs, new_app, queue)
    seen: list[aqw.BatchInfo] = []
    ran: list[str] = []

    @app.task(max_retries=0)
    async def resize(image: Image, ctx: aqw.Context) -> None:
        ran.append(ctx.job_id)
        if image.id == 3:
            raise ValueError("bad image")

    @app.task
    async def summary(ctx: aqw.Context) -> None:
        assert ctx.batch is not None
        seen.append(ctx.batch)

    async with app.batch(on_complete=summary, on_failure=summary, on_success=summary) as batch:
        await batch.enqueue_many(resize, [Image(id=i) for i in range(12)])
    assert batch.info is not None and (batch.info.state, batch.info.total) == ("sealed", 12)
    await run_burst(app, within=60, concurrency=8)
    await until(lambda: len(seen) >= 2, 30, "both callbacks")
    await run_burst(app, within=30)  # nothing more comes: each callback was sent once
    info = await app.batch_info(batch.id)
    assert info is not None and info.state == "complete"
    assert (info.total, info.succeeded, info.failed, info.pending) == (12, 11, 1, 0)
    assert sorted(info.callbacks) == ["complete", "failure"]  # not success: one died
    assert len(seen) == 2 and {(s.succeeded, s.failed) for s in seen} == {(11, 1)}
    assert len(ran) == 12
    assert (
        await pg_rows.fetchval("SELECT count(*) FROM aqw_sqs_keys_outbox WHERE queue = $1", queue)
        == 0
    )
    for kind in ("complete", "failure"):  # each callback's key names its one job
        holder = await pg_rows.fetchval(
            "SELECT job_id FROM aqw_sqs_keys WHERE queue = $1 AND key = $2",
            queue,
            callback_key(batch.id, kind),
        )
        assert holder == info.callbacks[kind]
    assert await app.batch_results(batch.id) == {}  # no job records in this store


async def test_postgres_a_child_received_again_after_its_count_counts_nothing(
    sqs: SQSKit, new_app: AppFactory, queue: str, pg_rows: asyncpg.Connection
) -> None:
    app = await _pg_app(sqs, new_app, queue, visibility=2, lease_ttl=2.0)
    ran: Counter[int] = Counter()
    done: list[aqw.BatchInfo] = []

    @app.task
    async def resize(image: Image) -> None:
        ran[image.id] += 1

    @app.task
    async def summary(ctx: aqw.Context) -> None:
        assert ctx.batch is not None
        done.append(ctx.batch)

    connection = broker_of(app)._connection
    real_delete = connection.delete
    failed: list[str] = []

    async def delete_once_refused(receipt: str, url: str) -> bool:
        if not failed:  # the first delete: as if the worker died right after the count
            failed.append(receipt)
            return False
        return await real_delete(receipt, url)

    connection.delete = delete_once_refused  # type: ignore[method-assign]
    async with app.batch(on_complete=summary) as batch:
        await batch.enqueue_many(resize, [Image(id=i) for i in range(5)])
    async with app.worker(concurrency=2):
        await until(lambda: sum(ran.values()) >= 6 and done, 60, "a child run twice, the callback")
    assert failed and max(ran.values()) >= 2 and sorted(ran) == list(range(5))
    info = await app.batch_info(batch.id)
    assert info is not None
    assert (info.state, info.total, info.succeeded, info.pending) == ("complete", 5, 5, 0)
    assert len(done) == 1 and done[0].succeeded == 5


async def test_postgres_nested_and_empty_batches_and_a_sealed_one_refuses_children(
    sqs: SQSKit, new_app: AppFactory, queue: str, pg_rows: asyncpg.Connection
) -> None:
    app = await _pg_app(sqs, new_app, queue)
    seen: list[tuple[str, aqw.BatchInfo]] = []

    @app.task
    async def resize(image: Image) -> None: ...

    @app.task
    async def summary(name: str, ctx: aqw.Context) -> None:
        assert ctx.batch is not None
        seen.append((name, ctx.batch))

    async with app.batch(on_complete=summary, payload="empty") as empty:
        pass
    assert empty.info is not None and empty.info.state == "complete"  # at its seal
    async with app.batch(on_complete=summary, payload="outer") as outer:
        await outer.enqueue(resize, Image(id=1))
        async with outer.batch(on_complete=summary, payload="inner") as inner:
            await inner.enqueue_many(resize, [Image(id=2), Image(id=3)])
    with pytest.raises(aqw.ConfigError, match="is sealed"):
        await app.broker.batches.add(outer.id, [])  # type: ignore[union-attr]
    await run_burst(app, within=60, concurrency=4)
    await until(lambda: len(seen) >= 3, 30, "three callbacks")
    by_name = {name: info for name, info in seen}
    assert sorted(by_name) == ["empty", "inner", "outer"] and len(seen) == 3
    assert (by_name["empty"].total, by_name["inner"].succeeded) == (0, 2)
    info = await app.batch_info(outer.id)
    inner_info = await app.batch_info(inner.id)
    assert info is not None and inner_info is not None
    assert (inner_info.state, inner_info.parent) == ("complete", outer.id)
    assert (info.state, info.total, info.succeeded) == ("complete", 2, 2)
    assert await app.broker.batches.children(outer.id, 0, 10) == [  # type: ignore[union-attr]
        *(await app.broker.batches.children(outer.id, 0, 1)),  # type: ignore[union-attr]
        f"batch:{inner.id}",
    ]


async def test_postgres_a_flow_with_edges_is_refused_in_one_line(
    sqs: SQSKit, new_app: AppFactory, queue: str, pg_rows: asyncpg.Connection
) -> None:
    app = await _pg_app(sqs, new_app, queue)

    @app.task(keep_result=True)
    async def fetch() -> int:
        return 4

    @app.task(keep_result=True)
    async def square(x: int) -> int:
        return x * x

    flow = aqw.Flow()
    flow.add(square, after=flow.add(fetch))
    with pytest.raises(aqw.ConfigError, match="records=redis://") as refused:
        await app.start(flow)
    assert "\n" not in str(refused.value) and "keeps no job records" in str(refused.value)
    if await pg_rows.fetchval("SELECT to_regclass('aqw_sqs_keys_batches') IS NOT NULL"):
        assert not await pg_rows.fetchval(  # refused before anything was written
            "SELECT count(*) FROM aqw_sqs_keys_batches WHERE queue = $1", queue
        )


async def test_postgres_counts_racing_for_one_child_count_it_once(
    sqs: SQSKit, new_app: AppFactory, queue: str, pg_rows: asyncpg.Connection
) -> None:
    """Two brokers (two workers) settle each child of a batch at once, as a redelivered
    child's two holders would: each child counts once (its member row flips once), the
    batch completes once and its callback job is decided once (one outbox row, one run)."""
    app = await _pg_app(sqs, new_app, queue)
    other = await _pg_app(sqs, new_app, queue)
    done: list[aqw.BatchInfo] = []

    @app.task
    async def resize(image: Image) -> None: ...

    @app.task
    async def summary(ctx: aqw.Context) -> None:
        assert ctx.batch is not None
        done.append(ctx.batch)

    async with app.batch(on_complete=summary) as batch:
        sent = await batch.enqueue_many(resize, [Image(id=i) for i in range(20)])
    ids = [str(e) for e in sent]
    jobs = [Job(id=i, task="resize", payload={}, headers={BATCH_HEADER: batch.id}) for i in ids]
    parts = [broker_of(a).batches for a in (app, other)]
    await asyncio.gather(  # before any worker runs them: both "holders" settle each child
        *(p.settled(job, "succeeded", None, 60.0) for job in jobs for p in parts)  # type: ignore[union-attr]
    )
    info = await app.batch_info(batch.id)
    assert info is not None
    assert (info.state, info.total, info.succeeded, info.pending) == ("complete", 20, 20, 0)
    await run_burst(app, within=60)  # the children run, and their settles count nothing
    assert len(done) == 1 and done[0].succeeded == 20
    again = await app.batch_info(batch.id)
    assert again is not None and (again.succeeded, again.failed) == (20, 0)
    assert (
        await pg_rows.fetchval("SELECT count(*) FROM aqw_sqs_keys_outbox WHERE queue = $1", queue)
        == 0
    )
