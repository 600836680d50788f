"""The SQS broker against moto in server mode, through the real aioboto3 client and the real
aqw runtime. Fixtures: tests/brokers/conftest.py."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aioboto3  # noqa: F401 - the sqs extra must be installed for these tests
import pytest
from pydantic import BaseModel

import aqw
from aqw.brokers import from_url
from aqw.brokers.sqs import MAX_DELAY, SQSBroker
from aqw.errors import StaleStart
from tests._helpers import eventually, redis_url_db

from .conftest import AppFactory, SQSKit, broker_of

ROOT = Path(__file__).resolve().parents[2]

#: ``eventually``, polling moto gently (it is slow under load).
until = functools.partial(eventually, interval=0.05)


def fast_retry(max_retries: int = 5) -> aqw.RetryPolicy:
    return aqw.RetryPolicy(max_retries=max_retries, base=0.05, cap=0.1)


class Order(BaseModel):
    n: int


class Event(BaseModel):
    x: int


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_from_url_name_and_queue_url_forms() -> None:
    b = from_url(
        "sqs://jobs?region=eu-west-1&endpoint_url=http://127.0.0.1:9&dlq=dead&wait=20"
        "&visibility=45&task=ingest&create=1"
    )
    assert isinstance(b, SQSBroker)
    assert (b.queue, b.region, b.endpoint_url) == ("jobs", "eu-west-1", "http://127.0.0.1:9")
    assert (b.dlq_name, b.wait, b.visibility, b.default_task) == ("dead", 20, 45, "ingest")
    assert (b.create, b.fifo) == (True, False)
    assert b.system == "aws_sqs"

    aws = from_url("sqs://https://sqs.ap-south-1.amazonaws.com/123456789012/orders.fifo?dlq=x")
    assert isinstance(aws, SQSBroker)
    assert (aws.queue, aws.region, aws.endpoint_url, aws.fifo) == (
        "orders.fifo",
        "ap-south-1",
        None,
        True,
    )
    assert aws.queue_url == "https://sqs.ap-south-1.amazonaws.com/123456789012/orders.fifo"

    local = from_url("sqs://http://127.0.0.1:5000/123456789012/work?region=us-east-1")
    assert isinstance(local, SQSBroker)
    assert (local.queue, local.endpoint_url) == ("work", "http://127.0.0.1:5000")

    with pytest.raises(aqw.ConfigError, match="unknown sqs:// option"):
        from_url("sqs://jobs?regoin=us-east-1")
    with pytest.raises(aqw.ConfigError, match="wait"):
        from_url("sqs://jobs?wait=60")
    with pytest.raises(aqw.ConfigError, match="integer"):
        from_url("sqs://jobs?visibility=soon")


@pytest.mark.timeout(20)
async def test_missing_queue_fails_fast_unless_create(sqs: SQSKit, new_app: AppFactory) -> None:
    broker = from_url(sqs.url("nowhere"))
    with pytest.raises(aqw.ConfigError, match="'nowhere' does not exist"):
        await broker.connect()
    await broker.close()

    created = from_url(sqs.url("made", create=1, dlq="made-dead", visibility=7))
    await created.connect()
    await created.start_consuming("c")
    assert await sqs.attribute(await sqs.queue_url("made"), "VisibilityTimeout") == "7"
    assert await sqs.queue_url("made-dead")
    await created.close()

    no_dlq = new_app(sqs.url("made"))

    @no_dlq.task
    async def noop() -> None: ...

    with pytest.raises(aqw.ConfigError, match="no dead-letter queue"):
        async with no_dlq.worker(concurrency=1):
            pass
    await no_dlq.close()


# -- producing and consuming ------------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_publish_attributes_fetch_limits_and_batched_deletes(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    url = await sqs.create("jobs", dead="jobs-dead")
    app = new_app(sqs.url("jobs", dlq="jobs-dead"))

    @app.task(name="work")
    async def work(n: int) -> None: ...

    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await app.enqueue(work, list(range(35)), headers={"traceparent": tp})
    broker = broker_of(app)
    await broker.start_consuming("t")

    asked = [time.monotonic()]
    first = await broker.fetch(25, block=1)
    asked.append(time.monotonic())
    assert len(first) == 25  # three concurrent receives, never more than asked
    broker.expect_lease_ttl(44.5)  # the runtime's hint: receive with the lease's visibility
    second = await broker.fetch(25, block=1)
    asked.append(time.monotonic())
    assert len(second) == 10
    # Each visibility counts from its receive's send, which came within its fetch call:
    # the lease's 44.5 s rounded up to whole seconds, and the queue's own 30 s.
    visible = broker._held[second[0].id].visible_until
    assert asked[1] + 45 <= visible <= asked[2] + 45
    visible = broker._held[first[0].id].visible_until
    assert asked[0] + 30 <= visible <= asked[1] + 30
    deliveries = first + second
    assert len({d.id for d in deliveries}) == 35
    d = deliveries[0]
    job = aqw.Job.decode(d.data)
    assert d.attributes["aqw-job-id"] == job.id
    assert d.attributes["aqw-task"] == "work"
    assert d.attributes["traceparent"] == tp
    assert d.delivery_count == 1 and d.receipt

    results = await asyncio.gather(*(broker.ack(d, None, None) for d in deliveries))
    assert all(results)
    deleter = broker._batchers[("delete", url)]
    assert deleter.calls <= 6  # 35 acks in DeleteMessageBatch calls of up to 10
    assert await sqs.count(url) == 0
    assert await broker.fetch(5, block=0) == []
    await app.close()


@pytest.mark.timeout(30)
async def test_round_trip_through_the_runtime(sqs: SQSKit, new_app: AppFactory) -> None:
    url = await sqs.create("rt", dead="rt-dead")
    app = new_app(sqs.url("rt", dlq="rt-dead"))
    seen: list[tuple[int, int, int]] = []

    @app.task
    async def handle(order: Order, ctx: aqw.Context) -> None:
        seen.append((order.n, ctx.attempt, ctx.fencing_token))

    ids = await app.enqueue(handle, [Order(n=i) for i in range(25)])
    async with app.worker(concurrency=8, grace=2) as worker:
        await until(lambda: len(seen) >= 25, 15, "25 jobs")
        await asyncio.sleep(0.3)
    assert sorted(n for n, _, _ in seen) == list(range(25))
    assert {(a, f) for _, a, f in seen} == {(1, 1)}  # first receive: attempt 1, fence 1
    assert worker.stats.processed == 25 and worker.stats.failed == 0
    assert len(set(ids)) == 25
    assert await sqs.count(url) == 0
    depth = await app.broker.depth()
    assert depth.as_dict() == {"waiting": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    await app.close()


@pytest.mark.timeout(30)
async def test_retry_keeps_the_message_and_counts_receives(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    await sqs.create("re", dead="re-dead")
    app = new_app(sqs.url("re", dlq="re-dead"), retry=fast_retry())
    runs: list[tuple[str, int]] = []

    @app.task(name="flaky")
    async def flaky(ctx: aqw.Context) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        if ctx.attempt < 3:
            raise RuntimeError("not yet")

    await app.enqueue(flaky, [None])
    async with app.worker(concurrency=2, grace=2) as worker:
        await until(lambda: worker.stats.processed == 1, 15, "the third attempt")
    assert [a for _, a in runs] == [1, 2, 3]
    assert len({job_id for job_id, _ in runs}) == 1
    assert worker.stats.retried == 2
    assert await broker_of(app).stats() == {"retried": 2, "processed": 1}
    info = await app.job(runs[0][0])  # the record, kept in this process
    assert info is not None and (info.state, info.attempts) == ("succeeded", 3), info
    assert info.error is not None and "not yet" in info.error.message  # the last failure's
    await app.close()


# -- leases: visibility -----------------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_a_pause_after_a_receive_cannot_make_a_start_look_safe(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    """A consumer paused after a receive's reply came in and before it was handled: its
    message's visibility ran out meanwhile, and another consumer received, ran and deleted it.
    The message counts as hidden from the receive's send, not from its handling, so the
    start does not take it for safe: it sets the visibility with its receipt, SQS refuses
    it, and the start is a ``StaleStart``, taking nothing. (moto refuses the receipt of a
    deleted message, the case shown; it takes the stale receipt of a message received again
    and still in flight, so that case cannot be shown here.)"""
    url = await sqs.create("st", dead="st-dead")
    a, b = (broker_of(new_app(sqs.url("st", dlq="st-dead", visibility=3))) for _ in "ab")
    for name, broker in (("a", a), ("b", b)):
        await broker.connect()
        await broker.start_consuming(name)
    sent = aqw.Job(task="work", payload=None)
    await a.publish([sent])
    real_call = a._connection.call
    received = asyncio.Event()

    async def paused(op: str, **params: Any) -> dict[str, Any]:
        reply = await real_call(op, **params)
        if op == "receive_message" and reply.get("Messages"):
            received.set()
            await asyncio.sleep(4.5)  # the pause: past the 3 s visibility and the takeover
        return reply

    a._connection.call = paused  # type: ignore[method-assign]
    fetching = asyncio.ensure_future(a.fetch(1, block=1))
    await asyncio.wait_for(received.wait(), 5)
    again: list[Any] = []
    deadline = time.monotonic() + 10
    while not again and time.monotonic() < deadline:
        again += await b.fetch(1, block=1)
    [d2] = again
    lease_b = aqw.Lease(b.job_lease_backend(sent, None, d2), b.job_lease_key(sent), ttl=5)
    await lease_b.acquire()
    assert await b.ack(d2, sent, lease_b) is True
    [d] = await fetching
    stale = aqw.Lease(a.job_lease_backend(sent, None, d), a.job_lease_key(sent), ttl=1.5)
    with pytest.raises(StaleStart):
        await stale.acquire()
    assert stale.fencing_token == 0
    assert await a.keep_alive(d) is False
    assert await sqs.count(url) == 0


@pytest.mark.timeout(40)
async def test_heartbeat_keeps_a_job_three_times_longer_than_visibility(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    """Visibility 2 s, handler 6 s: the lease renews the visibility, so the message is never
    received again, though a second worker (its own broker and client) polls all along."""
    url = await sqs.create("hb", visibility=2, dead="hb-dead")
    runs: Counter[str] = Counter()
    attempts: list[int] = []
    apps = [new_app(sqs.url("hb", dlq="hb-dead"), lease_ttl=2) for _ in range(2)]
    for app in apps:

        @app.task(name="slow")
        async def slow(n: int, ctx: aqw.Context) -> None:
            runs[ctx.job_id] += 1
            attempts.append(ctx.attempt)
            await asyncio.sleep(6)

    await apps[0].enqueue("slow", [1, 2, 3])
    async with (
        apps[0].worker(concurrency=2, grace=8) as w0,
        apps[1].worker(concurrency=2, grace=8) as w1,
    ):
        await until(lambda: w0.stats.processed + w1.stats.processed == 3, 20, "3 slow jobs")
    assert sorted(runs.values()) == [1, 1, 1]
    assert attempts == [1, 1, 1]
    assert w0.stats.lease_busy + w1.stats.lease_busy == 0
    assert await sqs.count(url) == 0
    for app in apps:
        await app.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", ["purge", "not-in-flight"])
async def test_failed_heartbeat_cancels_the_handler(
    sqs: SQSKit, new_app: AppFactory, fault: str
) -> None:
    """A renewal SQS refuses must cancel the handler. moto accepts stale receipt handles (AWS
    refuses them once the message was received again), so the fault is injected: either the
    message is purged out from under the worker (moto then answers ReceiptHandleIsInvalid), or
    the batch call answers MessageNotInflight as AWS does for a message no longer in flight."""
    url = await sqs.create("hf", visibility=2, dead="hf-dead")
    app = new_app(sqs.url("hf", dlq="hf-dead"), lease_ttl=1.5)
    started, cancelled = asyncio.Event(), asyncio.Event()
    reasons: list[str | None] = []

    @app.task
    async def long_job(ctx: aqw.Context) -> None:
        started.set()
        try:
            await asyncio.sleep(20)
        except asyncio.CancelledError:
            assert ctx.lease is not None
            reasons.append(ctx.lease.lost_reason)
            cancelled.set()
            raise

    await app.enqueue(long_job, [None])
    async with app.worker(concurrency=1, grace=1) as worker:
        await asyncio.wait_for(started.wait(), 10)
        broker = broker_of(app)
        if fault == "purge":
            await sqs.client.purge_queue(QueueUrl=url)
        else:
            client = broker._client

            async def refuse(**params: Any) -> dict[str, Any]:
                return {
                    "Successful": [],
                    "Failed": [
                        {
                            "Id": e["Id"],
                            "Code": "AWS.SimpleQueueService.MessageNotInflight",
                            "SenderFault": True,
                            "Message": "not in flight",
                        }
                        for e in params["Entries"]
                    ],
                }

            client.change_message_visibility_batch = refuse
        await asyncio.wait_for(cancelled.wait(), 10)
        # Stopped by the refused renewal, before the lease could run out by itself.
        [reason] = reasons
        assert reason is not None and "expired" not in reason, reason
        await until(lambda: worker.stats.lease_lost == 1, 5, "the lease loss to be counted")
        assert worker.stats.processed == 0 and worker.stats.retried == 0
    await app.close()


# -- dead letters -----------------------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_queue_redrive_policy_moves_poison_to_the_dlq(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    await sqs.create("rd", visibility=2, dead="rd-dead", max_receives=2)
    dead_url = await sqs.queue_url("rd-dead")
    app = new_app(sqs.url("rd"), retry=fast_retry(max_retries=10))  # DLQ from the RedrivePolicy
    attempts: list[int] = []

    @app.task(name="poison")
    async def poison(n: int, ctx: aqw.Context) -> None:
        attempts.append(ctx.attempt)
        raise ValueError("always fails")

    [job_id] = await app.enqueue(poison, [7])
    async with app.worker(concurrency=2, grace=1):
        await until(lambda: _positive(sqs, dead_url), 15, "the redrive")
    assert attempts == [1, 2]  # SQS redrove it at the third receive: our retries never ran out
    [dead] = await app.dlq.list()
    assert dead.error_type == "MaxReceiveCountExceeded"
    assert (dead.task, dead.job_id, dead.attempts) == ("poison", job_id, 2)
    assert dead.job is not None and dead.job.payload == 7
    assert (await app.broker.depth()).dead == 1
    await app.close()


async def _positive(sqs: SQSKit, url: str) -> bool:
    return await sqs.count(url) > 0


@pytest.mark.timeout(30)
async def test_bad_messages_go_to_the_dlq_with_a_reason(sqs: SQSKit, new_app: AppFactory) -> None:
    url = await sqs.create("bad", dead="bad-dead")
    app = new_app(sqs.url("bad", dlq="bad-dead"))

    @app.task(name="count")
    async def count(n: int) -> None: ...

    bodies = [
        "not json at all",
        json.dumps({"x": 1}),  # plain JSON, and no task= for it
        json.dumps({"v": 1, "task": "nope", "payload": 1}),
        json.dumps({"v": 1, "task": "count", "payload": "seven"}),
    ]
    for body in bodies:
        await sqs.client.send_message(QueueUrl=url, MessageBody=body)
    async with app.worker(concurrency=4, grace=1) as worker:
        await until(lambda: worker.stats.dead == 4, 15, "4 dead letters")
    dead = await app.dlq.list()
    by_type = Counter(d.error_type for d in dead)
    assert by_type == {"MalformedJob": 2, "UnknownTask": 1, "ValidationError": 1}
    reasons = {d.error_type + ": " + d.error for d in dead}
    assert any("unknown task 'nope'" in r for r in reasons)
    assert any("payload failed validation" in r for r in reasons)
    assert {d.data.decode() for d in dead if d.error_type == "MalformedJob"} == set(bodies[:2])
    assert all(d.worker == worker.name and d.traceback for d in dead)
    assert await sqs.count(url) == 0
    await app.close()


@pytest.mark.timeout(30)
async def test_dlq_list_get_replay_and_purge(sqs: SQSKit, new_app: AppFactory) -> None:
    await sqs.create("ops", dead="ops-dead")
    app = new_app(sqs.url("ops", dlq="ops-dead"))
    accept = False
    done: list[int] = []

    @app.task(name="picky")
    async def picky(n: int) -> None:
        if not accept:
            raise aqw.Reject("not today")
        done.append(n)

    await app.enqueue(picky, [1, 2, 3])
    async with app.worker(concurrency=3, grace=1) as worker:
        await until(lambda: worker.stats.dead == 3, 10, "3 rejections")
    listed = await app.dlq.list()
    assert sorted(d.job.payload for d in listed if d.job) == [1, 2, 3]
    assert {d.error_type for d in listed} == {"Reject"}
    assert all(d.attempts == 1 and d.task == "picky" for d in listed)
    one = await app.dlq.get(listed[0].id)
    assert one is not None and one.job_id == listed[0].job_id
    assert await app.dlq.count() == 3

    accept = True
    assert await app.dlq.replay([listed[0].id]) == 1
    async with app.worker(concurrency=3, grace=1):
        await until(lambda: len(done) == 1, 10, "the replayed job")
    assert done == [listed[0].job.payload if listed[0].job else None]
    assert await app.dlq.purge(ids=[d.id for d in listed[1:]]) == 2
    assert await app.dlq.count() == 0
    await app.close()


# -- FIFO -------------------------------------------------------------------------------------


@pytest.mark.timeout(40)
async def test_fifo_groups_run_in_order_through_retries(sqs: SQSKit, new_app: AppFactory) -> None:
    """SQS hands out a whole group in one ReceiveMessage (moto does too); the broker asks one
    message per call on FIFO queues so concurrent jobs cannot overtake within a group."""
    await sqs.create("orders.fifo", dead="orders-dead")
    app = new_app(sqs.url("orders.fifo", dlq="orders-dead"), retry=fast_retry())
    started: dict[str, list[int]] = defaultdict(list)
    finished: dict[str, list[int]] = defaultdict(list)
    failed_once: set[tuple[str, int]] = set()

    @app.task(name="step")
    async def step(group: str, seq: int) -> None:
        started[group].append(seq)
        await asyncio.sleep(random.uniform(0, 0.03))
        if seq == 3 and (group, seq) not in failed_once:
            failed_once.add((group, seq))
            raise aqw.Retry(delay=0)
        finished[group].append(seq)

    for group in "AB":
        await app.enqueue(
            step, [{"group": group, "seq": i} for i in range(10)], headers={"aqw-group": group}
        )
    async with app.worker(concurrency=10, grace=1):
        await until(lambda: sum(map(len, finished.values())) == 20, 30, "20 FIFO jobs")
    for group in "AB":
        assert finished[group] == list(range(10)), (group, finished[group])
        assert started[group] == [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9], (group, started[group])
    with pytest.raises(aqw.ConfigError, match="FIFO"):
        await app.enqueue(step, [{"group": "A", "seq": 99}], delay=5)
    await app.close()


# -- crashes, delays, other producers ---------------------------------------------------------

WORKER_SCRIPT = """
import asyncio, sys
import aqw

app = aqw.App(sys.argv[1], lease_ttl=2)

@app.task(name="victim")
async def victim(n: int, ctx: aqw.Context) -> None:
    with open(sys.argv[2], "a") as f:
        f.write(ctx.job_id + "\\n")
    await asyncio.sleep(60)

async def main() -> None:
    async with app.worker(concurrency=5):
        await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.mark.timeout(60)
async def test_sigkilled_worker_messages_come_back_once(
    sqs: SQSKit, new_app: AppFactory, tmp_path: Path
) -> None:
    url = await sqs.create("crash", visibility=2, dead="crash-dead")
    broker_url = sqs.url("crash", dlq="crash-dead")
    script, started_log = tmp_path / "worker.py", tmp_path / "started.txt"
    script.write_text(WORKER_SCRIPT)
    app = new_app(broker_url, lease_ttl=2)
    runs: Counter[str] = Counter()
    attempts: list[int] = []

    @app.task(name="victim")
    async def victim(n: int, ctx: aqw.Context) -> None:
        runs[ctx.job_id] += 1
        attempts.append(ctx.attempt)

    ids = await app.enqueue(victim, [1, 2, 3])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), broker_url, str(started_log), env=env
    )
    try:
        await until(
            lambda: started_log.exists() and len(started_log.read_text().split()) == 3,
            20,
            "the subprocess to start 3 jobs",
        )
        proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert sorted(started_log.read_text().split()) == sorted(ids)
    async with app.worker(concurrency=5, grace=1) as worker:
        await until(lambda: worker.stats.processed == 3, 15, "the 3 abandoned jobs")
        await asyncio.sleep(3)  # past another visibility timeout: nothing comes back
    assert dict(runs) == {job_id: 1 for job_id in ids}
    assert attempts == [2, 2, 2]  # the killed run counted as attempt 1
    assert await sqs.count(url) == 0
    await app.close()


@pytest.mark.timeout(30)
async def test_delays_short_and_beyond_fifteen_minutes(sqs: SQSKit, new_app: AppFactory) -> None:
    url = await sqs.create("later", dead="later-dead")
    app = new_app(sqs.url("later", dlq="later-dead"))
    ran: list[tuple[float, int, str]] = []

    @app.task(name="tick")
    async def tick(n: int, ctx: aqw.Context) -> None:
        ran.append((time.time(), ctx.attempt, ctx.job_id))

    broker = broker_of(app)
    t0 = time.time()
    # 3 s: still delayed when the depth is read, even on a loaded machine (1.5 s was not)
    await app.enqueue(tick, [1], delay=3.0)
    await app.enqueue(tick, [2], delay=MAX_DELAY + 100)  # DelaySeconds=900 + aqw-not-before
    assert (await broker.depth()).delayed == 2

    # A message that arrives before its not-before time (as the 900 s leg would) is not handed
    # out; near its time it is re-sent fresh, so the job still runs as attempt 1.
    job = aqw.Job(task="tick", payload=3)
    entry = broker._entry(job, 0, t0 + 4.0)
    await sqs.client.send_message(QueueUrl=url, **entry)
    # One far off: hidden with a visibility change instead (it stays in flight).
    far = aqw.Job(task="tick", payload=4)
    await sqs.client.send_message(QueueUrl=url, **broker._entry(far, 0, time.time() + 5000))

    async with app.worker(concurrency=4, grace=1):
        await until(lambda: len(ran) == 2, 15, "the delayed and the not-before job")
        await asyncio.sleep(0.5)
    (t1, a1, _), (t3, a3, id3) = sorted(ran)
    assert t1 - t0 >= 3.0 and a1 == 1
    assert t3 - t0 >= 4.0 and a3 == 1 and id3 == job.id
    depth = await broker.depth()
    assert (depth.delayed, depth.in_flight) == (1, 1)  # the 900 s leg, and the far one hidden
    await app.close()


@pytest.mark.timeout(40)
async def test_aws_cli_plain_json_message_is_consumed(sqs: SQSKit, new_app: AppFactory) -> None:
    import awscli  # noqa: F401 - in the dev extra: a missing CLI is a failure, not a skip

    url = await sqs.create("ingest", dead="ingest-dead")
    app = new_app(sqs.url("ingest", dlq="ingest-dead", task="ingest"))
    got: list[tuple[Any, str, int]] = []

    @app.task(name="ingest")
    async def ingest(event: Event, ctx: aqw.Context) -> None:
        got.append((event.x, ctx.job.headers.get("traceparent", ""), ctx.attempt))

    cmd = [
        sys.executable,
        "-m",
        "awscli",
        "sqs",
        "send-message",
        "--endpoint-url",
        sqs.endpoint,
        "--queue-url",
        url,
        "--message-body",
        '{"x": 1}',
        "--output",
        "json",
    ]
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    message_id = json.loads(out)["MessageId"]
    async with app.worker(concurrency=2, grace=1) as worker:
        await until(lambda: worker.stats.processed == 1, 10, "the CLI message")
    assert got == [(1, "", 1)]
    assert await sqs.count(url) == 0
    assert message_id
    await app.close()


@pytest.mark.timeout(20)
async def test_resource_locks_local_by_default_and_shared_with_a_lock_store(
    sqs: SQSKit, tmp_path: Path
) -> None:
    """Without ``locks=`` a resource lock only excludes holders in this process (SQS has no
    lock primitive); with ``locks=redis://...`` it is a real Redis lease with fencing."""
    await sqs.create("lk", dead="lk-dead")
    local = [from_url(sqs.url("lk", dlq="lk-dead")) for _ in range(2)]
    key = "aqw:{lk}:lock:customer:7"
    assert await local[0].lease_backend().acquire(key, "a", 5000) is not None
    assert await local[0].lease_backend().acquire(key, "b", 5000) is None
    assert await local[1].lease_backend().acquire(key, "b", 5000) is not None  # another process

    import redis.asyncio as redis

    probe = redis.Redis.from_url(redis_url_db(15))
    await probe.ping()  # CI starts Redis: an absent server fails this test
    shared_key = f"aqw:{{lk-{tmp_path.name}}}:lock:customer:7"
    try:
        shared = [from_url(sqs.url("lk", dlq="lk-dead", locks=redis_url_db(15))) for _ in range(2)]
        for broker in shared:
            await broker.connect()
        first = await shared[0].lease_backend().acquire(shared_key, "a", 5000)
        assert first is not None
        assert await shared[1].lease_backend().acquire(shared_key, "b", 5000) is None
        assert await shared[0].lease_backend().release(shared_key, "a")
        second = await shared[1].lease_backend().acquire(shared_key, "b", 5000)
        assert second is not None and second > first  # fencing tokens grow across holders
        assert await shared[1].lease_backend().release(shared_key, "b")
        for broker in shared:
            await broker.close()
    finally:
        await probe.delete(shared_key, shared_key + ":fence")
        await probe.aclose()
