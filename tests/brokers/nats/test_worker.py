"""A worker on ``nats://`` end to end against the real server: jobs run, a retry comes back
as its next attempt, a failing job is dead-lettered with its reason and replayed, and an
idempotency key enqueues once."""

from __future__ import annotations

import asyncio

import pytest

import aqw
from tests._helpers import run_burst

from .conftest import URL

pytestmark = pytest.mark.timeout(60)


async def test_a_worker_runs_retries_and_dead_letters(nats_queue: str) -> None:
    app = aqw.App(f"{URL}?queue={nats_queue}", retry=aqw.RetryPolicy(max_retries=1, base=0.01))
    assert app.broker.system == "nats" and app.broker.queue == nats_queue
    seen: list[tuple[int, int]] = []

    @app.task(name="double")
    async def double(n: int, ctx: aqw.Context) -> int:
        seen.append((n, ctx.attempt))
        assert ctx.fencing_token > 0
        if n == 3 and ctx.attempt == 1:
            raise RuntimeError("the first try fails")
        return n * 2

    @app.task(name="explode", max_retries=0)
    async def explode(n: int) -> None:
        raise ValueError(f"bad {n}")

    await app.enqueue(double, [21])
    await app.enqueue(double, [3])
    [dead] = await app.enqueue(explode, [5])
    first = await app.enqueue(double, [7], key="order-7")
    again = await app.enqueue(double, [7], key="order-7")
    assert first == again
    await run_burst(app, concurrency=4)
    assert sorted(seen) == [(3, 1), (3, 2), (7, 1), (21, 1)]
    [entry] = await app.broker.dlq_list()
    assert (entry.job_id, entry.error_type, entry.error) == (
        dead,
        "ValueError",
        "ValueError: bad 5",
    )
    depth = await app.broker.depth()
    assert depth.as_dict() == {"waiting": 0, "in_flight": 0, "delayed": 0, "dead": 1}
    job = entry.job
    assert job is not None
    assert await app.broker.dlq_replay([(entry.id, job)]) == 1
    # Back in the queue: waiting, or in flight when the burst's last pull request, still
    # open on the server for its last slice (``_levels.PULL_SLICE``), took it.
    back = await app.broker.depth()
    assert (back.waiting + back.in_flight, back.dead) == (1, 0)
    await app.broker.close()


async def test_results_and_cancels_cross_processes_through_the_records_bucket(
    nats_queue: str,
) -> None:
    """The producer and the worker are separate brokers (as separate processes are): the
    producer waits for a result the worker writes, and cancels a job the worker then does
    not run."""
    url = f"{URL}?queue={nats_queue}"
    producer, consumer = aqw.App(url), aqw.App(url)
    ran: list[int] = []
    for app in (producer, consumer):

        @app.task(name="triple", keep_result=True)
        async def triple(n: int) -> int:
            ran.append(n)
            return n * 3

    [ok] = await producer.enqueue("triple", [14])
    [skipped] = await producer.enqueue("triple", [99])
    assert await producer.cancel(skipped) == "cancelled"
    waiting = asyncio.create_task(producer.result(ok, timeout=30))
    await run_burst(consumer, concurrency=2)
    assert await waiting == 42
    assert ran == [14]
    info = await producer.job(skipped)
    assert info is not None and info.state == "cancelled"
    await producer.close()
    await consumer.close()


async def test_the_ack_window_grows_to_the_workers_longest_lease(nats_queue: str) -> None:
    """AckWait is the longest lease TTL the worker will take (told after connecting), and
    it only grows: a worker of shorter leases leaves it as it is."""
    app = aqw.App(f"{URL}?queue={nats_queue}", lease_ttl=45.0)

    @app.task(name="noop")
    async def noop() -> None:
        return None

    worker = app.worker(burst=True)
    await asyncio.wait_for(worker.run(), 20)
    js = app.broker._js  # type: ignore[attr-defined]
    info = await js.consumer_info(f"AQW_{nats_queue}", "aqw")
    assert info.config.ack_wait == 45.0
    await app.close()
    short = aqw.App(f"{URL}?queue={nats_queue}", lease_ttl=5.0)

    @short.task(name="noop")
    async def noop_too() -> None:
        return None

    await asyncio.wait_for(short.worker(burst=True).run(), 20)
    info = await short.broker._js.consumer_info(f"AQW_{nats_queue}", "aqw")  # type: ignore[attr-defined]
    assert info.config.ack_wait == 45.0
    await short.close()


async def test_a_start_writes_the_record_its_producer_wrote_without_reading_it(
    nats_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's message carries its record's revision as enqueued: the start writes against
    it at once, and reads only the record that changed since (a cancel by another process,
    which it then sees and refuses)."""
    from aqw.brokers.nats import _records

    reads: list[str] = []
    read = _records.KvJobRecords._read

    async def counted(self: _records.KvJobRecords, job_id: str) -> object:
        reads.append(job_id)
        return await read(self, job_id)

    producer = aqw.App(f"{URL}?queue={nats_queue}")
    ran: list[int] = []

    @producer.task(name="work")
    async def work(n: int) -> None:
        ran.append(n)

    ids = await producer.enqueue(work, list(range(5)))
    other = aqw.App(f"{URL}?queue={nats_queue}")
    assert await other.cancel(ids[2]) == "cancelled"
    await other.close()
    await producer.close()

    monkeypatch.setattr(_records.KvJobRecords, "_read", counted)
    app = aqw.App(f"{URL}?queue={nats_queue}")
    app.task(name="work")(work.fn)
    try:
        worker = await run_burst(app, concurrency=5)
        assert sorted(ran) == [0, 1, 3, 4]
        assert (worker.stats.processed, worker.stats.cancelled) == (4, 1)
        assert set(reads) == {ids[2]}  # only the record another process changed is read
        assert (await app.job(ids[1])).state == "succeeded"
        assert (await app.job(ids[2])).state == "cancelled"
    finally:
        await app.close()


async def test_a_job_longer_than_a_fixed_ack_window_keeps_its_delivery(nats_queue: str) -> None:
    """The URL fixes AckWait at 2 s under the default 30 s lease: the lease renews (and keeps
    the delivery alive) every third of the window, not of the lease, so a 3 s job runs once
    and its ack is taken (``Broker.delivery_window``)."""
    app = aqw.App(f"{URL}?queue={nats_queue}&ack_wait=2")
    runs: list[int] = []

    @app.task(name="slow")
    async def slow(n: int) -> int:
        runs.append(n)
        await asyncio.sleep(3.0)
        return n

    async with app.worker(concurrency=2):
        job_id = await slow.enqueue(1)
        assert await app.result(job_id, timeout=20) is None
    assert runs == [1]
    assert app.broker.delivery_window == 2.0
    await app.close()


async def test_a_settle_after_the_window_closed_releases_the_lease(nats_queue: str) -> None:
    """The ack is refused (the message is being delivered again), and the job's lease goes
    with it: the next delivery's start does not wait out the lease's TTL (before, every
    redelivery was refused for 30 s and the job dead-lettered as delivered too often)."""
    from aqw.brokers.nats import NatsBroker, Settings
    from aqw.job import Job
    from aqw.lease import Lease

    b = NatsBroker(nats_queue, [URL], Settings(ack_wait=1.0))
    try:
        sent = Job(task="t", payload=1)
        await b.publish([sent])
        await b.start_consuming("c1")
        [d] = await b.fetch(1, 5.0)
        lease = Lease(b.job_lease_backend(sent, None, d), b.job_lease_key(sent), ttl=30)
        await lease.acquire()
        await asyncio.sleep(1.1)  # past the window
        assert await b.ack(d, sent, lease) is False
        assert await b.lease_backend().acquire(b.job_lease_key(sent), "next", 30_000) is not None
    finally:
        await b.close()
