"""Idempotency keys on SQS with a ``records=`` store (the real Redis and the real PostgreSQL),
and the job records SQS keeps in the process, against moto in server mode through the real
aioboto3 client and the real runtime. Fixtures: tests/brokers/conftest.py; the design:
``aqw.brokers.sqs._keys`` and docs/brokers/sqs.md."""

from __future__ import annotations

import asyncio
import functools
import time
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
from aqw.brokers import from_url
from aqw.brokers.sqs import RecordsUnavailable, SQSBroker, SQSUnavailable
from aqw.brokers.sqs._keys import open_store
from aqw.testing.contract import MarksContract, Subject
from tests._helpers import PG_DSNS, eventually, free_port, pg_where, redis_url_db, run_burst

from .conftest import AppFactory, SQSKit, broker_of

#: ``eventually``, polling moto gently (it is slow under load).
until = functools.partial(eventually, interval=0.05)

#: The Redis database the Redis store uses here (db 15 is the lock-store test's).
REDIS_DB = 14


class Order(BaseModel):
    n: int


async def find_pg_dsn() -> str:
    """The first of ``PG_DSNS`` that answers; fails (never skips) when none does."""
    for dsn in PG_DSNS:
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError):
            continue
        await conn.close()
        return dsn
    pytest.fail(
        f"PostgreSQL at {pg_where(PG_DSNS[0])} is not answering (AQW_TEST_PG_DSN)", pytrace=False
    )


@pytest.fixture
def queue() -> str:
    """A queue name of its own: the stores outlive moto's reset between tests."""
    return f"k{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["redis", "postgres"])
async def records(request: pytest.FixtureRequest, queue: str) -> AsyncIterator[str]:
    """A ``records=`` URL (the real Redis, or the real PostgreSQL); the test queue's records
    are removed afterwards."""
    if request.param == "redis":
        url = redis_url_db(REDIS_DB)
        probe = redis.Redis.from_url(url)
        await probe.ping()  # CI starts Redis: an absent server fails the test
        try:
            yield url
        finally:
            found = [k async for k in probe.scan_iter(match=f"aqw:{{{queue}}}:*", count=1000)]
            if found:
                await probe.delete(*found)
            await probe.aclose()
        return
    dsn = await find_pg_dsn()
    yield dsn
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM aqw_sqs_keys WHERE queue = $1", queue)
        await conn.execute("DELETE FROM aqw_sqs_keys_marks WHERE queue = $1", queue)
    finally:
        await conn.close()


def with_task(app: aqw.App, runs: Counter[int]) -> None:
    @app.task(name="charge")
    async def charge(order: Order) -> None:
        runs[order.n] += 1


# -- the guarantee ------------------------------------------------------------------------------


@pytest.mark.timeout(40)
async def test_concurrent_enqueues_of_one_key_send_one_message_and_run_once(
    sqs: SQSKit, new_app: AppFactory, queue: str, records: str
) -> None:
    """Four producers (each its own broker and client), eight concurrent enqueues of one
    key: one SQS message, one id, seven duplicates; a worker runs it once; after it
    completed, the key is still taken."""
    url = await sqs.create(queue, dead=f"{queue}-dead")
    apps = [new_app(sqs.url(queue, dlq=f"{queue}-dead", records=records)) for _ in range(4)]
    runs: Counter[int] = Counter()
    for app in apps:
        with_task(app, runs)

    got = await asyncio.gather(
        *(apps[i % 4].enqueue("charge", [Order(n=7)], key="order-7") for i in range(8))
    )
    ids = [e for (e,) in got]
    assert len(set(ids)) == 1
    assert sorted(e.duplicate for e in ids) == [False] + [True] * 7
    assert await sqs.count(url) == 1

    worker = await run_burst(apps[0], concurrency=4, grace=2)
    assert runs == Counter({7: 1})
    assert worker.stats.processed == 1 and worker.stats.duplicates_skipped == 0
    assert await sqs.count(url) == 0

    (again,) = await apps[3].enqueue("charge", [Order(n=7)], key="order-7")
    assert (again, again.duplicate) == (ids[0], True)  # the completion record holds the key
    assert await sqs.count(url) == 0
    job = aqw.Job(task="charge", payload={"n": 7}, key="order-7")
    assert await apps[1].broker.is_completed(job) is True
    assert await apps[1].broker.is_completed(aqw.Job(task="charge", key="other")) is False

    (other,) = await apps[2].enqueue("charge", [Order(n=8)], key="order-8")
    assert other.duplicate is False and other != ids[0]
    assert await sqs.count(url) == 1


@pytest.mark.timeout(40)
async def test_redelivered_finished_keyed_job_is_skipped(
    sqs: SQSKit, new_app: AppFactory, queue: str, records: str
) -> None:
    """A worker that dies between the completion record and the delete: the message comes
    back when its visibility runs out, and the next worker (another process: it has none of
    the first one's job records) skips it as completed."""
    url = await sqs.create(queue, visibility=2, dead=f"{queue}-dead")
    app = new_app(sqs.url(queue, dlq=f"{queue}-dead", records=records), lease_ttl=2)
    runs: Counter[int] = Counter()
    with_task(app, runs)
    broker = broker_of(app)
    (job_id,) = await app.enqueue("charge", [Order(n=1)], key="order-1")

    real_delete = broker._connection.delete
    lost: list[str] = []

    async def crash_before_delete(receipt: str, queue_url: str) -> bool:
        if queue_url == url and not lost:
            lost.append(receipt)  # the process "died" here: the message is not deleted
            return True
        return await real_delete(receipt, queue_url)

    broker._connection.delete = crash_before_delete  # type: ignore[method-assign]
    async with app.worker(concurrency=2, grace=2) as worker:
        await until(lambda: bool(lost), 20, "the first ack")
    assert worker.stats.processed == 1
    nxt = new_app(sqs.url(queue, dlq=f"{queue}-dead", records=records), lease_ttl=2)
    with_task(nxt, runs)
    async with nxt.worker(concurrency=2, grace=2) as second:
        await until(lambda: second.stats.duplicates_skipped == 1, 20, "the redelivery")
    assert runs == Counter({1: 1})  # run once: the redelivery was skipped as completed
    assert await sqs.count(url) == 0
    (dup,) = await app.enqueue("charge", [Order(n=1)], key="order-1")
    assert (dup, dup.duplicate) == (job_id, True)


@pytest.mark.timeout(30)
async def test_a_failed_send_frees_the_key(
    sqs: SQSKit, new_app: AppFactory, queue: str, records: str
) -> None:
    url = await sqs.create(queue, dead=f"{queue}-dead")
    app = new_app(sqs.url(queue, dlq=f"{queue}-dead", records=records))
    runs: Counter[int] = Counter()
    with_task(app, runs)
    broker = broker_of(app)
    await broker.connect()
    real_call = broker._connection.call

    async def unreachable(op: str, **params: Any) -> dict[str, Any]:
        if op.startswith("send_message"):
            raise SQSUnavailable(f"sqs://{queue}: SQS {op} failed: connection reset")
        return await real_call(op, **params)

    broker._connection.call = unreachable  # type: ignore[method-assign]
    with pytest.raises(SQSUnavailable):
        await app.enqueue("charge", [Order(n=2)], key="order-2")
    broker._connection.call = real_call  # type: ignore[method-assign]
    assert await sqs.count(url) == 0

    (first,) = await app.enqueue("charge", [Order(n=2)], key="order-2")
    assert first.duplicate is False  # the failed enqueue left the key free
    (second,) = await app.enqueue("charge", [Order(n=2)], key="order-2")
    assert (second, second.duplicate) == (first, True)
    assert await sqs.count(url) == 1


@pytest.mark.timeout(30)
async def test_a_cancelled_send_frees_the_key(
    sqs: SQSKit, new_app: AppFactory, queue: str, records: str
) -> None:
    """An enqueue cancelled (a request timeout) while its message was being sent."""
    await sqs.create(queue, dead=f"{queue}-dead")
    app = new_app(sqs.url(queue, dlq=f"{queue}-dead", records=records))
    runs: Counter[int] = Counter()
    with_task(app, runs)
    broker = broker_of(app)
    await broker.connect()
    real_call = broker._connection.call

    async def hangs(op: str, **params: Any) -> dict[str, Any]:
        if op.startswith("send_message"):
            await asyncio.sleep(30)
        return await real_call(op, **params)

    broker._connection.call = hangs  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await app.enqueue("charge", [Order(n=3)], key="order-3")
    broker._connection.call = real_call  # type: ignore[method-assign]
    (first,) = await app.enqueue("charge", [Order(n=3)], key="order-3")
    assert first.duplicate is False


@pytest.mark.timeout(20)
async def test_store_steps(queue: str, records: str) -> None:
    """The store's steps on their own: claims expire, a release or a confirm touches only its
    own job's claim, a lapsed claim is taken again by its confirm when nobody else took it,
    and a completion record keeps the key taken after the enqueue record is gone."""
    store = open_store(records)
    q = queue
    try:
        assert await store.claim(q, "k", "j1", 0.3) is None
        assert await store.claim(q, "k", "j2", 60) == "j1"
        await asyncio.sleep(0.4)  # j1's producer died before its send: the key frees itself
        assert await store.claim(q, "k", "j2", 60) is None
        assert await store.confirm(q, "k", "j1", 60) is False  # j2 holds it now
        await store.release(q, "k", "j1")  # not j1's claim: it stays
        assert await store.claim(q, "k", "j3", 60) == "j2"
        await store.release(q, "k", "j2")
        assert await store.claim(q, "k", "j3", 60) is None
        await store.complete(q, "k", "j3", 60)  # it ran before its producer confirmed
        assert await store.confirm(q, "k", "j3", 60) is True
        assert await store.is_completed(q, "k") is True

        assert await store.claim(q, "slow", "a", 0.2) is None
        await asyncio.sleep(0.3)  # a send slower than the pending TTL, nobody took the key
        assert await store.confirm(q, "slow", "a", 60) is True
        assert await store.claim(q, "slow", "b", 60) == "a"
        assert await store.is_completed(q, "slow") is False

        assert await store.claim(q, "short", "x", 0.2) is None
        assert await store.confirm(q, "short", "x", 0.2) is True
        await store.complete(q, "short", "x", 60)
        await asyncio.sleep(0.3)  # the enqueue record is gone, the completion record is not
        assert await store.claim(q, "short", "y", 60) == "x"
        assert await store.is_completed(q, "short") is True
        assert await store.is_completed(q, "never") is False
    finally:
        await store.close()


# -- set-up mistakes ----------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_bad_records_url_is_a_config_error_naming_it() -> None:
    for bad in ("mysql://app:s3cret@db/jobs", "http://127.0.0.1:9", "redis-ish"):
        with pytest.raises(aqw.ConfigError, match="records=") as caught:
            from_url(f"sqs://jobs?region=us-east-1&records={bad}")
        assert "s3cret" not in str(caught.value)
        with pytest.raises(aqw.ConfigError, match="records="):
            SQSBroker("jobs", region="us-east-1", records=bad)
    ok = from_url("sqs://jobs?region=us-east-1&records=rediss://h:6380/2?ssl_ca_certs=/a+b/ca.pem")
    assert isinstance(ok, SQSBroker)
    assert ok.records_url == "rediss://h:6380/2?ssl_ca_certs=/a%2Bb/ca.pem"
    pg = from_url("sqs://jobs?records=postgresql://app@db:5432/jobs?sslmode=require")
    assert isinstance(pg, SQSBroker)
    assert pg.records_url == "postgresql://app@db:5432/jobs?sslmode=require"
    assert from_url("sqs://jobs").records_url is None  # type: ignore[attr-defined]


@pytest.mark.timeout(20)
async def test_keys_without_records_are_a_config_error_naming_records(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    url = await sqs.create("plain", dead="plain-dead")
    app = new_app(sqs.url("plain", dlq="plain-dead"))
    runs: Counter[int] = Counter()
    with_task(app, runs)
    with pytest.raises(aqw.ConfigError, match=r"records=redis://") as caught:
        await app.enqueue("charge", [Order(n=1)], key="order-1")
    assert "SQSBroker(records=" in str(caught.value)
    assert await sqs.count(url) == 0
    job = aqw.Job(task="charge", key="order-1")
    assert await app.broker.is_completed(job) is False  # and the ack writes nothing


@pytest.mark.timeout(20)
async def test_store_down_or_refusing_sends_nothing(
    sqs: SQSKit, new_app: AppFactory, queue: str
) -> None:
    """An unreachable store is a retriable error, a database that does not exist a
    ConfigError naming records=; neither sends a message."""
    url = await sqs.create(queue, dead=f"{queue}-dead")
    runs: Counter[int] = Counter()
    down = new_app(
        sqs.url(queue, dlq=f"{queue}-dead", records=f"redis://127.0.0.1:{free_port()}/0")
    )
    with_task(down, runs)
    with pytest.raises(RecordsUnavailable):
        await down.enqueue("charge", [Order(n=1)], key="order-1")
    assert isinstance(RecordsUnavailable("x"), ConnectionError)  # Broker.transient_errors

    pg_down = new_app(
        sqs.url(queue, dlq=f"{queue}-dead", records=f"postgresql://x@127.0.0.1:{free_port()}/x")
    )
    with_task(pg_down, runs)
    with pytest.raises(RecordsUnavailable):
        await pg_down.enqueue("charge", [Order(n=1)], key="order-1")

    no_db = (await find_pg_dsn()).rsplit("/", 1)[0] + "/aqw_no_such_database"
    missing = new_app(sqs.url(queue, dlq=f"{queue}-dead", records=no_db))
    with_task(missing, runs)
    with pytest.raises(aqw.ConfigError, match="records="):
        await missing.enqueue("charge", [Order(n=1)], key="order-1")
    assert await sqs.count(url) == 0


# -- job records, in the process ----------------------------------------------------------------


@pytest.mark.timeout(40)
async def test_local_records_through_a_worker_run(sqs: SQSKit, new_app: AppFactory) -> None:
    """Records kept by the broker in this process: queued at enqueue, succeeded, dead with
    its DLQ entry and error, retried attempts counted, and a queued job cancelled here never
    runs. (No results: keep_result needs shared records, and is refused, see below.)"""
    await sqs.create("rec", dead="rec-dead")
    app = new_app(sqs.url("rec", dlq="rec-dead"), retry=aqw.RetryPolicy(max_retries=1, base=0.05))
    ran: list[str] = []

    @app.task(name="double")
    async def double(n: int, ctx: aqw.Context) -> int:
        ran.append(ctx.job_id)
        if n == 3 and ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return n * 2

    @app.task(name="explode", retry=aqw.RetryPolicy(max_retries=0))
    async def explode(n: int, ctx: aqw.Context) -> None:
        ran.append(ctx.job_id)
        raise ValueError(f"bad {n}")

    (ok,) = await app.enqueue(double, [21])
    (flaky,) = await app.enqueue(double, [3])
    (dead,) = await app.enqueue(explode, [5])
    (skipped,) = await app.enqueue(double, [9])
    info = await app.job(ok)
    assert info is not None and info.state == "queued" and info.task == "double"
    assert await app.cancel(skipped) == "cancelled"

    started = time.time()
    await run_burst(app, concurrency=4, grace=2)

    info = await app.job(ok)
    assert info is not None and info.state == "succeeded", info
    assert info.attempts == 1 and not info.has_result
    assert info.finished_at is not None and info.finished_at.timestamp() >= started
    assert await app.result(ok, timeout=1) is None  # the task keeps no result

    info = await app.job(flaky)
    assert info is not None and (info.state, info.attempts) == ("succeeded", 2)

    info = await app.job(dead)
    assert info is not None and info.state == "dead", info
    assert info.error is not None and info.error.type == "ValueError"
    assert "bad 5" in info.error.message
    entries = await app.broker.dlq_list()
    assert info.dlq_entry is not None and info.dlq_entry in {e.id for e in entries}
    with pytest.raises(aqw.JobFailed):
        await app.result(dead, timeout=1)

    info = await app.job(skipped)
    assert info is not None and info.state == "cancelled"
    assert skipped not in ran
    assert await sqs.count(await sqs.queue_url("rec")) == 0

    (entry,) = [e for e in entries if e.job_id == dead]
    assert entry.job is not None
    assert await app.broker.dlq_replay([(entry.id, entry.job)]) == 1
    info = await app.job(dead)
    assert info is not None and (info.state, info.dlq_entry) == ("queued", None)


async def test_keep_result_is_refused_at_worker_start_naming_the_records(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    """Job records kept in this process cannot hand a result to a producer elsewhere: a
    task that keeps results is refused, in one line naming the part and the fix."""
    await sqs.create("kr", dead="kr-dead")
    app = new_app(sqs.url("kr", dlq="kr-dead"))

    @app.task(name="double", keep_result=True)
    async def double(n: int) -> int:
        return n * 2

    with pytest.raises(aqw.ConfigError) as refused:
        await app.worker().start()
    message = str(refused.value)
    assert "\n" not in message and "task 'double': keep_result needs job records" in message
    assert "in this process only" in message and "redis://" in message


@pytest.mark.timeout(30)
async def test_a_running_job_cancelled_in_the_process_stops_at_its_next_heartbeat(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    url = await sqs.create("cx", dead="cx-dead")
    app = new_app(sqs.url("cx", dlq="cx-dead"), lease_ttl=1.5)
    stopped: list[str] = []

    @app.task(name="slow")
    async def slow(ctx: aqw.Context) -> None:
        try:
            await asyncio.sleep(20)
        finally:
            stopped.append(ctx.job_id)

    (job_id,) = await app.enqueue(slow, [None])
    async with app.worker(concurrency=1, grace=2):

        async def running() -> bool:
            info = await app.job(job_id)
            return info is not None and info.state == "running"

        await until(running, 10, "the job to run")
        assert await app.cancel(job_id) == "cancelling"
        with pytest.raises(aqw.JobCancelled):  # within 5 s: long before the handler's 20
            await app.result(job_id, timeout=5)
    info = await app.job(job_id)
    assert info is not None and info.state == "cancelled" and info.cancel_requested
    assert stopped == [job_id]
    assert await sqs.count(url) == 0


# -- schedule marks in the records= store ----------------------------------------------------


class TestMarksInTheRecordsStore(MarksContract):
    """With ``records=``, the periodic tasks' schedule marks live in that store, shared by
    every process (``StoreMarks``): the marks contract on each store."""

    @pytest.fixture
    async def subject(self, sqs: SQSKit, queue: str, records: str) -> AsyncIterator[Subject]:
        await sqs.create(queue, dead=f"{queue}-dead")

        def new_broker(**_: Any) -> aqw.Broker:
            return from_url(sqs.url(queue, dlq=f"{queue}-dead", records=records), queue)

        yield Subject(new_broker, queue)


async def test_without_a_records_store_the_marks_are_kept_in_the_process(sqs: SQSKit) -> None:
    broker = from_url(sqs.url("nomarks", dlq="nomarks-dead"), "nomarks")
    assert broker.marks.shared is False
