"""The broker contract (``aqw.brokers.base.Broker``), one set of tests run against every broker:
the in-process ``MemoryBroker``, ``RedisBroker`` on fakeredis and on the real Redis,
``SQSBroker`` on moto (server mode, tests/brokers/conftest.py), and ``PartitionedBroker`` (a
queue over 3 partitions) on fakeredis and on the real Redis.

Each test gets ``contract_broker``: a connected broker consuming a fresh queue as consumer
``c1``, and ``consumer()`` for more consumers of the same queue. Where a broker legitimately
differs, the test asserts the documented different behaviour and names the document:

- SQS (docs/brokers/sqs.md, the ``aqw.brokers.sqs`` package docstring): the visibility timeout
  is the lease, so ``reclaim`` recovers nothing (an unsettled message comes back by itself);
  a retry is a visibility change, so the body cannot change and the next attempt comes from
  ``ApproximateReceiveCount``, which every receive counts (a requeue too); messages hidden by a
  retry count as in flight; idempotency keys at enqueue raise ``ConfigError``; job records,
  running-job states and heartbeats stay in the broker object (``Broker`` defaults,
  aqw/brokers/base.py); ``depth()`` counts are approximate, so they are compared with a
  bounded wait.

SQS cases are kept to a handful of messages each: moto is slow under a backlog
(../shared/FIELD-NOTES.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import open_backend

import aqw
from aqw.brokers._flow import Limits
from aqw.brokers.base import Broker, Delivery, Failure, Finish
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.partitioned import PartitionedBroker
from aqw.brokers.redis import RedisBroker
from aqw.errors import StaleStart
from aqw.lease import Lease
from aqw.record import JobError, JobInfo
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(30)

KINDS = [
    "memory",
    "fakeredis",
    pytest.param("redis", marks=pytest.mark.redis),
    "sqs",
    "fakeredis-partitioned",
    pytest.param("redis-partitioned", marks=pytest.mark.redis),
]

#: How long an SQS count may take to settle (``Approximate...`` attributes).
SQS_SETTLE = 5.0


# -- the fixture -------------------------------------------------------------------------------


@dataclass
class Contract:
    """A broker under test (consumer ``c1``, connected) and a factory of more consumers."""

    kind: str
    queue: str
    broker: Broker
    new_broker: Callable[..., Broker]
    made: list[Broker] = field(default_factory=list)

    @property
    def sqs(self) -> bool:
        return self.kind == "sqs"

    async def consumer(self, name: str = "c2", **sqs_options: Any) -> Broker:
        """Another connected consumer of the same queue (``sqs_options``: SQSBroker keyword
        arguments such as ``visibility``, ignored by the other brokers)."""
        broker = self.new_broker(**sqs_options)
        self.made.append(broker)
        await broker.connect()
        await broker.start_consuming(name)
        return broker


@pytest.fixture(params=KINDS)
def contract_kind(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """The broker kind, and for SQS the moto endpoint (moto starts only when SQS is tested)."""
    kind: str = request.param
    return kind, request.getfixturevalue("sqs_endpoint") if kind == "sqs" else None


@pytest.fixture
async def contract_broker(
    contract_kind: tuple[str, str | None], queue_names: Callable[[], str]
) -> AsyncIterator[Contract]:
    """A connected broker on a fresh queue, every broker kind in turn; closed at the end."""
    kind, endpoint = contract_kind
    queue = queue_names()  # its keys are deleted from the real Redis afterwards
    async with contextlib.AsyncExitStack() as stack:
        if kind == "sqs":
            assert endpoint is not None
            new_broker = await stack.enter_async_context(_sqs_queue(endpoint, queue))
        else:
            backend = await stack.enter_async_context(open_backend(kind, queue))

            def new_broker(**_: Any) -> Broker:
                return backend.broker()

        kit = Contract(kind, queue, new_broker(), new_broker)
        kit.made.append(kit.broker)
        try:
            await kit.broker.connect()
            await kit.broker.start_consuming("c1")
            yield kit
        finally:
            for broker in kit.made:
                await broker.close()


@contextlib.asynccontextmanager
async def _sqs_queue(endpoint: str, queue: str) -> AsyncIterator[Callable[..., Broker]]:
    """A freshly reset moto, queue ``queue`` and its dead-letter queue, and a factory of
    SQSBrokers on them. No ``wait=``: the ``block`` of each fetch sets the long poll."""
    import aioboto3

    from aqw.brokers.sqs import SQSBroker

    from .conftest import SQSKit, _reset

    await asyncio.to_thread(_reset, endpoint)
    session = aioboto3.Session()
    async with session.client("sqs", region_name="us-east-1", endpoint_url=endpoint) as client:
        await SQSKit(endpoint, client).create(queue, dead=f"{queue}-dead")

        def new_broker(**options: Any) -> Broker:
            return SQSBroker(
                queue, region="us-east-1", endpoint_url=endpoint, dlq=f"{queue}-dead", **options
            )

        yield new_broker


# -- helpers -----------------------------------------------------------------------------------


def job(n: int = 1, **fields: Any) -> aqw.Job:
    return aqw.Job(task="work", payload={"n": n}, **fields)


def decoded(delivery: Delivery) -> aqw.Job:
    return aqw.Job.decode(delivery.data)


async def fetch_n(broker: Broker, n: int, within: float = 5.0) -> list[Delivery]:
    """The next ``n`` deliveries (promoting due jobs while waiting), no more."""
    deadline = time.monotonic() + within
    block = 1.0 if broker.system == "aws_sqs" else 0.1  # SQS: a 1 s long poll, not a busy loop
    got: list[Delivery] = []
    while len(got) < n:
        await broker.promote_due()
        got += await broker.fetch(n + 1 - len(got), block=block)  # one more than due shows
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {n} deliveries within {within}s")
    assert len(got) == n, f"expected {n} deliveries, got {len(got)}"
    assert len({d.id for d in got}) == n, "a delivery came twice"
    return got


async def fetch_one(broker: Broker, within: float = 5.0) -> Delivery:
    """The next delivery (promoting due jobs while waiting); exactly one must come."""
    [delivery] = await fetch_n(broker, 1, within)
    return delivery


async def assert_nothing_to_fetch(broker: Broker) -> None:
    await broker.promote_due()
    assert await broker.fetch(10, block=0) == []


async def assert_depth(
    kit: Contract, waiting: int, in_flight: int, delayed: int, dead: int
) -> None:
    """Exact at once on memory and Redis; SQS counts are approximate: equal within a bound."""
    want = (waiting, in_flight, delayed, dead)

    async def now() -> tuple[int, int, int, int]:
        d = await kit.broker.depth()
        return (d.waiting, d.in_flight, d.delayed, d.dead)

    if not kit.sqs:
        assert await now() == want
        return
    got: list[tuple[int, int, int, int]] = []

    async def settled() -> bool:
        got.append(await now())
        return got[-1] == want

    try:
        await eventually(settled, SQS_SETTLE, f"depth {want}")
    except AssertionError:
        raise AssertionError(f"SQS depth stayed {got[-1]}, expected {want}") from None


def delay(kit: Contract) -> float:
    """A short delay for retry and schedule tests (SQS delays and visibility: whole seconds)."""
    return 1.0 if kit.sqs else 0.4


def failure(**changes: Any) -> Failure:
    fields: dict[str, Any] = {
        "error_type": "ValueError",
        "error": "bad value 7",
        "traceback": "Traceback (most recent call last): ...",
        "worker": "w-1",
        "first_failed_at": 1_700_000_000.25,
        "failed_at": 1_700_000_042.5,
    }
    return Failure(**{**fields, **changes})


# -- publish and fetch ---------------------------------------------------------------------------


async def test_publish_then_fetch_gives_the_same_bytes_once(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(1)
    await b.publish([sent])
    d = await fetch_one(b)
    assert d.data == sent.encode()
    assert d.delivery_count == 1
    assert decoded(d) == sent
    # While it is unsettled, neither this consumer nor another gets it again.
    other = await kit.consumer("c2")
    assert await b.fetch(10, block=0) == []
    assert await other.fetch(10, block=0) == []


async def test_ack_removes_for_good_and_a_second_ack_is_refused(
    contract_broker: Contract,
) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(2)
    await b.publish([sent])
    d = await fetch_one(b)
    assert await b.ack(d, sent, None) is True
    await assert_depth(kit, 0, 0, 0, 0)
    assert await b.fetch(10, block=0) == []
    assert (await b.stats()).get("processed") == 1
    second = await b.ack(d, sent, None)
    if kit.sqs and second:
        pytest.xfail(
            "SQS: DeleteMessage succeeds for a receipt handle whose message is gone (AWS "
            "DeleteMessage docs; moto too), and SQSBroker keeps no record of settled deliveries"
        )
    assert second is False
    assert (await b.stats()).get("processed") == 1


async def test_keep_alive_only_for_our_own_unsettled_delivery(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(3)
    await b.publish([sent])
    d = await fetch_one(b)
    other = await kit.consumer("c2")
    assert await b.keep_alive(d) is True
    assert await other.keep_alive(d) is False
    assert await b.ack(d, sent, None) is True
    assert await b.keep_alive(d) is False


# -- retry, requeue, schedule ------------------------------------------------------------------


async def test_retry_is_due_at_its_time_with_the_next_attempt(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(4)
    await b.publish([sent])
    d = await fetch_one(b)
    # The next attempt, with a header the broker should carry if it can replace the body.
    nxt = sent.next_attempt().model_copy(update={"headers": {"retried": "yes"}})
    due = time.time() + delay(kit)
    assert await b.retry(d, nxt, due, None) is True
    await assert_nothing_to_fetch(b)
    again = await fetch_one(b, within=6)
    assert time.time() >= due - 0.05, "the retry came back before its due time"
    got = decoded(again)
    assert got.id == sent.id and got.attempt == 2
    if kit.sqs:
        # docs/brokers/sqs.md, "Retries through visibility": the body cannot change; the
        # attempt is the receive count (ApproximateReceiveCount), rewritten at fetch.
        assert again.delivery_count == 2
        assert got == sent.model_copy(update={"attempt": 2})
    else:
        assert again.data == nxt.encode()
    assert (await b.stats()).get("retried") == 1
    assert await b.ack(again, got, None) is True
    await assert_depth(kit, 0, 0, 0, 0)


async def test_requeue_is_available_at_once(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(5)
    await b.publish([sent])
    d = await fetch_one(b)
    assert await b.requeue(d, None) is True
    other = await kit.consumer("c2")
    again = await fetch_one(other, within=3)
    got = decoded(again)
    assert got.id == sent.id
    if kit.sqs:
        # docs/brokers/sqs.md: every receive counts as an attempt ("ctx.attempt is at least
        # the receive count"), one ended by a shutdown (a requeue) included.
        assert (got.attempt, again.delivery_count) == (2, 2)
    else:
        assert again.data == sent.encode() and got.attempt == 1
    assert await other.ack(again, got, None) is True
    await assert_depth(kit, 0, 0, 0, 0)


async def test_schedule_is_not_fetched_before_it_is_due(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    assert await b.promote_due() is None  # nothing scheduled
    sent = job(6)
    due = time.time() + delay(kit)
    await b.schedule([sent], due)
    await assert_depth(kit, 0, 0, 1, 0)
    left = await b.promote_due()
    if kit.sqs:
        assert left is None  # SQS delays the message itself (DelaySeconds): nothing to move
    else:
        assert left is not None and 0 < left <= delay(kit)
    await assert_nothing_to_fetch(b)
    d = await fetch_one(b, within=6)
    assert time.time() >= due - 0.05, "the scheduled job came before its time"
    assert d.data == sent.encode()
    assert await b.ack(d, sent, None) is True


async def test_scheduled_in_the_past_is_available_now(contract_broker: Contract) -> None:
    b = contract_broker.broker
    sent = job(7)
    await b.schedule([sent], time.time() - 5)
    d = await fetch_one(b, within=3)
    assert d.data == sent.encode()


# -- dead letters ------------------------------------------------------------------------------


async def test_dead_letter_records_the_failure_then_replay_and_delete(
    contract_broker: Contract,
) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(8)
    await b.publish([sent])
    d = await fetch_one(b)
    why = failure()
    entry_id = await b.dead_letter(d, sent, why, 3, None)
    assert isinstance(entry_id, str) and entry_id  # the new entry's id
    await assert_depth(kit, 0, 0, 0, 1)
    assert (await b.stats()).get("dead") == 1
    await assert_nothing_to_fetch(b)

    [dead] = await b.dlq_list()
    assert dead.id == entry_id
    assert (dead.error_type, dead.error, dead.attempts) == ("ValueError", "bad value 7", 3)
    assert (dead.task, dead.job_id, dead.worker) == ("work", sent.id, "w-1")
    assert dead.data == sent.encode() and dead.job == sent
    assert dead.traceback.startswith("Traceback")
    assert dead.first_failed_at == pytest.approx(why.first_failed_at)
    assert dead.last_failed_at == pytest.approx(why.failed_at)
    one = await b.dlq_get(dead.id)
    assert one is not None and (one.id, one.job_id, one.error) == (dead.id, sent.id, dead.error)
    assert await b.dlq_get("0-1" if not kit.sqs else "no-such-message") is None

    # Replay: back on the queue, gone from the DLQ.
    assert await b.dlq_replay([(dead.id, sent)]) == 1
    assert await b.dlq_list() == []
    await assert_depth(kit, 1, 0, 0, 0)
    again = await fetch_one(b)
    assert again.data == sent.encode()

    # Dead again, then purged.
    entry_id = await b.dead_letter(again, sent, failure(error="again"), 4, None)
    [dead2] = await b.dlq_list()
    assert dead2.id == entry_id
    assert (dead2.error, dead2.attempts) == ("again", 4)
    assert await b.dlq_delete([dead2.id]) == 1
    assert await b.dlq_list() == []
    assert await b.dlq_delete([dead2.id]) == 0
    await assert_depth(kit, 0, 0, 0, 0)


async def test_dead_letter_of_an_undecodable_message(contract_broker: Contract) -> None:
    """``job`` is None when the message could not be decoded: the DLQ keeps the raw bytes."""
    kit = contract_broker
    b = kit.broker
    sent = job(9)
    await b.publish([sent])
    d = await fetch_one(b)
    entry_id = await b.dead_letter(d, None, failure(error_type="MalformedJob"), 1, None)
    [dead] = await b.dlq_list()
    assert dead.id == entry_id
    assert dead.error_type == "MalformedJob" and dead.data == d.data
    if kit.sqs:
        # SQSBroker reads the job id and task back from the body when it is a job envelope.
        assert (dead.task, dead.job_id) == ("work", sent.id)
    else:
        assert (dead.task, dead.job_id) == ("", "")


# -- depth -------------------------------------------------------------------------------------


async def test_depth_through_publish_fetch_retry_and_dead_letter(
    contract_broker: Contract,
) -> None:
    kit = contract_broker
    b = kit.broker
    first, second = job(10), job(11)
    await assert_depth(kit, 0, 0, 0, 0)
    await b.publish([first, second])
    await assert_depth(kit, 2, 0, 0, 0)
    deliveries = await fetch_n(b, 2)
    await assert_depth(kit, 0, 2, 0, 0)
    by_id = {decoded(d).id: d for d in deliveries}
    assert await b.retry(by_id[first.id], first.next_attempt(), time.time() + 60, None)
    if kit.sqs:
        # docs/brokers/sqs.md, "Depth and counters": a message hidden by a retry is in flight.
        await assert_depth(kit, 0, 2, 0, 0)
    else:
        await assert_depth(kit, 0, 1, 1, 0)
    assert await b.dead_letter(by_id[second.id], second, failure(), 1, None) is not None
    if kit.sqs:
        await assert_depth(kit, 0, 1, 0, 1)
    else:
        await assert_depth(kit, 0, 0, 1, 1)


# -- leases ------------------------------------------------------------------------------------


async def test_job_lease_fencing_refusal_and_wrong_token_release(
    contract_broker: Contract,
) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(12)
    await b.publish([sent])
    d = await fetch_one(b)  # SQS: a job lease is the visibility of a message we hold
    leases = b.lease_backend()
    key = b.job_lease_key(sent)
    assert sent.id in key and kit.queue in key

    first = await leases.acquire(key, "token-a", 5000)
    assert first is not None and first >= 1
    assert await leases.acquire(key, "token-b", 5000) is None
    released = await leases.release(key, "token-b")
    if not kit.sqs:
        assert released is False
    # (SQS: release "only forgets the handle" and answers True whoever asks; either way the
    # holder keeps its lease, as the next acquire shows.)
    assert await leases.acquire(key, "token-c", 5000) is None
    assert await leases.renew(key, "token-a", 5000) is True
    assert await leases.renew(key, "token-c", 5000) is False
    assert await leases.release(key, "token-a") is True

    # The job delivered again: a new holder gets a greater fencing token.
    assert await b.requeue(d, None) is True
    again = await fetch_one(b, within=3)
    second = await leases.acquire(key, "token-c", 5000)
    assert second is not None and second > first
    assert await b.ack(again, sent, None) is True


async def test_lock_lease_fencing_tokens_grow(contract_broker: Contract) -> None:
    """``ctx.lock(name)`` leases (SQS without ``locks=``: local to the process, documented)."""
    b = contract_broker.broker
    leases = b.lease_backend()
    key = b.lock_key("customer:7")
    assert "customer:7" in key and contract_broker.queue in key
    first = await leases.acquire(key, "a", 5000)
    assert first is not None
    assert await leases.acquire(key, "b", 5000) is None
    assert await leases.release(key, "b") is False
    assert await leases.acquire(key, "b", 5000) is None
    assert await leases.release(key, "a") is True
    second = await leases.acquire(key, "b", 5000)
    assert second is not None and second > first
    assert await leases.release(key, "b") is True


async def test_lease_expires_after_its_ttl(contract_broker: Contract) -> None:
    b = contract_broker.broker
    leases = b.lease_backend()
    key = b.lock_key("short")
    assert await leases.acquire(key, "a", 200) is not None
    assert await leases.acquire(key, "b", 200) is None
    await asyncio.sleep(0.35)
    assert await leases.renew(key, "a", 200) is False
    assert await leases.acquire(key, "b", 5000) is not None


# -- recovery of abandoned deliveries ----------------------------------------------------------


async def test_reclaim_of_an_abandoned_delivery(contract_broker: Contract) -> None:
    kit = contract_broker
    sent = job(13)
    holder = await kit.consumer("holder", visibility=1)  # SQS: a 1 s visibility on receive
    rescuer = await kit.consumer("rescuer")
    await kit.broker.publish([sent])
    d = await fetch_one(holder)

    def ttl(_: aqw.Job | None) -> float:
        return 0.2

    if kit.sqs:
        # aqw.brokers.sqs: reclaim recovers nothing; the visibility timeout brings the message
        # back, and the receive counts as the next delivery.
        assert await rescuer.reclaim(10, ttl, 0.2) == []
        again = await fetch_one(rescuer, within=6)
        assert again.delivery_count == 2 and decoded(again).id == sent.id
        assert await rescuer.ack(again, decoded(again), None) is True
        await assert_depth(kit, 0, 0, 0, 0)
        return

    assert await rescuer.reclaim(10, ttl, 0.2) == []  # not idle long enough yet
    leases = holder.lease_backend()
    key = holder.job_lease_key(sent)
    assert await leases.acquire(key, "holder-token", 10_000) is not None
    await asyncio.sleep(0.3)
    assert await rescuer.reclaim(10, ttl, 0.2) == []  # a live holder is never robbed
    assert await leases.release(key, "holder-token") is True
    [again] = await rescuer.reclaim(10, ttl, 0.2)
    assert again.id == d.id and again.data == d.data and again.delivery_count == 2
    assert await holder.keep_alive(d) is False  # no longer ours
    assert await holder.ack(d, sent, None) is False  # the rescuer owns it now
    assert await rescuer.ack(again, sent, None) is True
    await assert_depth(kit, 0, 0, 0, 0)


async def test_a_held_lease_keeps_the_delivery(contract_broker: Contract) -> None:
    """A holder whose lease is held and renewed keeps its delivery past the broker's own
    timeout (memory, Redis: reclaim skips it; SQS: the lease extends the visibility)."""
    kit = contract_broker
    sent = job(14)
    holder = await kit.consumer("holder", visibility=1)
    rescuer = await kit.consumer("rescuer")
    await kit.broker.publish([sent])
    d = await fetch_one(holder)
    leases = holder.lease_backend()
    key = holder.job_lease_key(sent)
    assert await leases.acquire(key, "t", 3000) is not None
    await asyncio.sleep(1.5 if kit.sqs else 0.3)  # past the visibility / the reclaim TTL
    assert await holder.keep_alive(d) is True
    assert await rescuer.reclaim(10, lambda _: 0.2, 0.2) == []
    assert await rescuer.fetch(10, block=0) == []
    assert await holder.ack(d, sent, None) is True


# -- a start is only for a live delivery ------------------------------------------------------


async def test_a_start_after_a_takeover_and_settle_takes_nothing(contract_broker: Contract) -> None:
    """Consumer A fetches and pauses past its lease; B takes the delivery over (memory, Redis:
    reclaim; SQS: the visibility ran out), runs and acknowledges it; then A's start is refused
    (``StaleStart``), in the same step as the lease it would take: no lease key, no fencing
    token handed out, the record as B's settle left it (SQS: each broker object's own, the
    module docstring; A's reads as A left it). Under its limits too, refused before them."""
    kit = contract_broker
    a = await kit.consumer("a", visibility=1)  # SQS: a 1 s visibility on receive
    b = await kit.consumer("b")
    sent = job(60)
    await a.publish([sent])
    d = await fetch_one(a)
    if kit.sqs:
        again = await fetch_one(b, within=6)
    else:
        await asyncio.sleep(0.1)
        [again] = await b.reclaim(10, lambda _: 0.05, 0.05)
    got, lease_b = await start(b, again)
    assert await b.ack(again, got, lease_b, 0.0, Finish(keep_for=60)) is True
    settled = await rec(b, sent.id)
    mine = await rec(a, sent.id)

    key = a.job_lease_key(sent)
    backends = [a.job_lease_backend(sent, d)]
    if a.enforces_limits:
        backends.append(a.limited_lease_backend(sent, Limits("b", 10**9, 0, (("k", 1),)), d))
    for backend in backends:
        stale = Lease(backend, key, ttl=30)
        with pytest.raises(StaleStart) as refused:
            await stale.acquire()
        assert refused.value.job_id == sent.id and not refused.value.ended
        assert stale.fencing_token == 0
        assert await a.lease_backend().renew(key, stale.token, 5000) is False  # nothing taken
    assert await rec(b, sent.id) == settled
    assert await rec(a, sent.id) == mine
    if not kit.sqs:
        assert settled.state == "succeeded" and settled.fencing_token == lease_b.fencing_token
        # The next fencing token of the job's counter follows B's: A was handed none.
        assert await a.lease_backend().acquire(key, "probe", 5000) == lease_b.fencing_token + 1
        assert await a.lease_backend().release(key, "probe") is True
    assert await a.keep_alive(d) is False
    await assert_depth(kit, 0, 0, 0, 0)


async def test_a_start_of_an_ended_job_takes_nothing_and_drops_its_delivery(
    contract_broker: Contract,
) -> None:
    """The job's record has ended while a delivery of it is still pending to this consumer
    (here a second copy of the job): its start is refused (``StaleStart`` with ``ended``),
    takes nothing and leaves the record as it was; the leftover delivery is dropped unrun."""
    kit = contract_broker
    b = kit.broker
    sent = job(61)
    await b.publish([sent, sent])
    first, second = await fetch_n(b, 2)
    got, lease = await start(b, first)
    assert await b.ack(first, got, lease, 0.0, Finish(keep_for=60, result="1")) is True
    ended = await rec(b, sent.id)
    assert ended.state == "succeeded"
    key = b.job_lease_key(sent)
    stale = Lease(b.job_lease_backend(sent, second), key, ttl=30)
    with pytest.raises(StaleStart) as refused:
        await stale.acquire()
    assert refused.value.ended
    assert stale.fencing_token == 0
    assert await b.lease_backend().renew(key, stale.token, 5000) is False
    assert await rec(b, sent.id) == ended
    assert await b.keep_alive(second) is False  # dropped
    await assert_depth(kit, 0, 0, 0, 0)
    await assert_nothing_to_fetch(b)


async def test_give_back_unstarted(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    await b.publish([job(15), job(16)])
    got = await fetch_n(b, 2)
    given = await b.give_back_unstarted({got[0].id})
    if kit.sqs:
        # Broker.give_back_unstarted: SQS deliveries time out by themselves; SQSBroker keeps
        # the default (a fetch cancelled mid-poll gives its messages back itself).
        assert given == 0
        return
    assert given == 1
    other = await kit.consumer("c2")
    again = await fetch_one(other)
    assert again.data == got[1].data
    assert await b.keep_alive(got[0]) is True


# -- idempotency keys --------------------------------------------------------------------------


async def test_publish_unique_and_completion_records(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    keyed = job(17, key="order-17")
    if kit.sqs:
        # docs/brokers/sqs.md, "Depth and counters": idempotency keys at enqueue are not
        # available on SQS; nor are completion records.
        with pytest.raises(aqw.ConfigError):
            await b.publish_unique(keyed, 60, None)
        await b.publish([keyed])
        d = await fetch_one(b)
        assert await b.ack(d, keyed, None, record_ttl=60) is True
        assert await b.is_completed(keyed) is False
        return
    assert await b.publish_unique(keyed, 60, None) == (keyed.id, False)
    twin = job(17, key="order-17")
    assert await b.publish_unique(twin, 60, None) == (keyed.id, True)
    await assert_depth(kit, 1, 0, 0, 0)
    d = await fetch_one(b)
    assert d.data == keyed.encode()
    assert await b.is_completed(keyed) is False
    assert await b.ack(d, keyed, None, record_ttl=60) is True
    assert await b.is_completed(keyed) is True
    assert await b.is_completed(job(18, key="other")) is False
    assert await b.is_completed(job(19)) is False


# -- job records (aqw/record.py) -----------------------------------------------------------------
#
# SQS keeps its records in the broker object (the Broker defaults, ``local_records``): each
# case here runs on one SQS broker instance, where they hold as on the other brokers.

#: The keys of a running-job state (``RunningJob.state``, aqw/worker/_running.py).
STATE_KEYS = {
    "state",
    "job_id",
    "task",
    "attempt",
    "worker",
    "started_at",
    "lease_expires_at",
    "fencing_token",
    "progress",
    "message",
}


async def start(b: Broker, d: Delivery, ttl: float = 30.0) -> tuple[aqw.Job, Lease]:
    """Take the job lease of ``d``'s job as the worker does (``job_lease_backend``)."""
    sent = decoded(d)
    lease = Lease(b.job_lease_backend(sent, d), b.job_lease_key(sent), ttl=ttl)
    await lease.acquire()
    return sent, lease


async def rec(b: Broker, job_id: str) -> JobInfo:
    info = await b.record(job_id)
    assert info is not None, f"no record of {job_id}"
    assert info.id == job_id and not info.damaged
    return info


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def running(b: Broker, job_id: str, lease: Lease, **changes: str) -> dict[str, str]:
    """A running-job state of ``job_id`` under ``lease``, as a worker publishes it."""
    state = {
        "state": "running",
        "job_id": job_id,
        "task": "work",
        "attempt": "1",
        "worker": b.consumer,
        "started_at": repr(time.time()),
        "lease_expires_at": repr(lease.expires_at),
        "fencing_token": str(lease.fencing_token),
        "progress": "0.0",
        "message": "",
    }
    return {**state, **changes}


async def test_record_of_a_job_from_queued_to_succeeded(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(30)
    await b.publish([sent])
    queued = await rec(b, sent.id)
    assert (queued.state, queued.queue, queued.task, queued.attempts) == (
        "queued",
        kit.queue,
        "work",
        0,
    )
    assert queued.enqueued_at == at(sent.enqueued_at)
    assert (queued.started_at, queued.finished_at, queued.error, queued.key) == (None,) * 4
    assert not queued.finished and not queued.cancel_requested

    d = await fetch_one(b)
    before = time.time()
    got, lease = await start(b, d)
    after = time.time()
    run = await rec(b, sent.id)
    assert (run.state, run.attempts, run.worker) == ("running", 1, "c1")
    assert run.started_at is not None and at(before - 0.01) <= run.started_at <= at(after + 0.01)
    assert run.fencing_token == lease.fencing_token > 0
    assert run.lease_expires_at is not None and run.lease_expires_at > at(after + 20)
    assert run.enqueued_at == queued.enqueued_at

    finish = Finish("succeeded", keep_for=60, result='{"n": 30}')
    assert await b.ack(d, got, lease, 0.0, finish) is True
    done = await rec(b, sent.id)
    assert (done.state, done.attempts, done.finished) == ("succeeded", 1, True)
    assert done.has_result and done.result == {"n": 30}
    assert done.started_at == run.started_at
    assert done.finished_at is not None and run.started_at <= done.finished_at <= at(time.time())
    assert await b.cancel(sent.id) == "finished"
    assert await rec(b, sent.id) == done  # a cancel of a finished job changes nothing


async def test_records_of_delayed_and_requeued_jobs(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    later, past = job(31), job(32)
    due = time.time() + 60
    await b.schedule([later], due)
    await b.schedule([past], time.time() - 5)
    delayed = await rec(b, later.id)
    assert delayed.state == "delayed" and not delayed.finished
    assert delayed.run_at is not None and abs(delayed.run_at.timestamp() - due) < 1.0
    assert (await rec(b, past.id)).state == "queued"

    d = await fetch_one(b, within=3)
    got, lease = await start(b, d)
    assert got.id == past.id and (await rec(b, past.id)).state == "running"
    assert await b.requeue(d, lease, got) is True
    back = await rec(b, past.id)
    assert (back.state, back.attempts) == ("queued", 1)  # its story stays: it ran once


async def test_publish_unique_records_the_job_with_its_key(contract_broker: Contract) -> None:
    kit = contract_broker
    if kit.sqs:
        pytest.skip("SQS: no idempotency keys at enqueue (docs/brokers/sqs.md)")
    b = kit.broker
    keyed = job(33, key="order-33")
    assert await b.publish_unique(keyed, 60, None) == (keyed.id, False)
    twin = job(33, key="order-33")
    assert await b.publish_unique(twin, 60, None) == (keyed.id, True)
    info = await rec(b, keyed.id)
    assert (info.state, info.key) == ("queued", "order-33")
    assert await b.record(twin.id) is None  # the duplicate wrote nothing
    later = job(34, key="order-34")
    await b.publish_unique(later, 60, time.time() + 60)
    assert (await rec(b, later.id)).state == "delayed"


async def test_retry_records_the_error_and_the_last_attempt_fails(
    contract_broker: Contract,
) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(35)
    await b.publish([sent])
    d = await fetch_one(b)
    got, lease = await start(b, d)
    due = time.time() + delay(kit)
    why = failure(fingerprint="fp-35")
    assert await b.retry(d, got.next_attempt(), due, lease, why) is True
    retrying = await rec(b, sent.id)
    assert (retrying.state, retrying.attempts, retrying.finished) == ("retrying", 1, False)
    assert retrying.run_at is not None and abs(retrying.run_at.timestamp() - due) < 1.5
    assert retrying.error == JobError(
        type="ValueError", message="bad value 7", fingerprint="fp-35", traceback=why.traceback
    )

    again = await fetch_one(b, within=6)
    got2, lease2 = await start(b, again)
    second = await rec(b, sent.id)
    assert (second.state, second.attempts) == ("running", 2)
    assert second.fencing_token == lease2.fencing_token > lease.fencing_token
    last = failure(error_type="KeyError", error="gone", fingerprint="fp-k")
    assert await b.ack(again, got2, lease2, 0.0, Finish("failed", 60, failure=last)) is True
    failed = await rec(b, sent.id)
    assert (failed.state, failed.attempts, failed.finished) == ("failed", 2, True)
    assert failed.error is not None
    assert (failed.error.type, failed.error.message, failed.error.fingerprint) == (
        "KeyError",
        "gone",
        "fp-k",
    )
    assert failed.dlq_entry is None and not failed.has_result


async def test_dead_letter_record_names_the_entry_and_replay_queues_it(
    contract_broker: Contract,
) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(36)
    await b.publish([sent])
    d = await fetch_one(b)
    got, lease = await start(b, d)
    why = failure(fingerprint="fp-36")
    entry_id = await b.dead_letter(d, got, why, 1, lease, keep_for=60)
    assert entry_id
    dead = await rec(b, sent.id)
    assert (dead.state, dead.finished, dead.dlq_entry) == ("dead", True, entry_id)
    assert dead.error == JobError(
        type="ValueError", message="bad value 7", fingerprint="fp-36", traceback=why.traceback
    )
    assert dead.finished_at is not None and dead.attempts == 1
    [entry] = await b.dlq_list()
    assert entry.id == entry_id

    assert await b.dlq_replay([(entry_id, sent)]) == 1
    replayed = await rec(b, sent.id)
    assert (replayed.state, replayed.finished, replayed.dlq_entry) == ("queued", False, None)
    assert replayed.finished_at is None
    again = await fetch_one(b)
    got, lease = await start(b, again)
    assert (await rec(b, sent.id)).state == "running"
    assert await b.ack(again, got, lease) is True  # Finish() by default: succeeded
    assert (await rec(b, sent.id)).state == "succeeded"


async def test_ends_unrun_cancelled_and_expired(contract_broker: Contract) -> None:
    b = contract_broker.broker
    old = job(37, expires_at=time.time() - 1)
    await b.publish([old])
    d = await fetch_one(b)
    assert (await rec(b, old.id)).expires_at == at(old.expires_at or 0)
    assert await b.ack(d, decoded(d), None, 0.0, Finish("expired", 60)) is True
    expired = await rec(b, old.id)
    assert (expired.state, expired.finished, expired.started_at) == ("expired", True, None)
    assert await b.cancel(old.id) == "finished"


async def test_cancel_a_queued_job_refuses_its_start(contract_broker: Contract) -> None:
    b = contract_broker.broker
    sent = job(38)
    await b.publish([sent])
    assert await b.cancel_requested(sent.id) is False
    assert await b.cancel(sent.id, 60) == "cancelled"
    cancelled = await rec(b, sent.id)
    assert (cancelled.state, cancelled.finished, cancelled.cancel_requested) == (
        "cancelled",
        True,
        True,
    )
    assert cancelled.finished_at is not None and cancelled.started_at is None
    assert await b.cancel_requested(sent.id) is True
    assert await b.cancel(sent.id) == "finished"
    # Its message is still delivered; its start is refused and takes nothing.
    d = await fetch_one(b)
    key = b.job_lease_key(sent)
    with pytest.raises(aqw.JobCancelled):
        await b.job_lease_backend(sent).acquire(key, "token-a", 5000)
    assert await b.lease_backend().renew(key, "token-a", 5000) is False  # no lease was taken
    assert (await rec(b, sent.id)).started_at is None
    assert (await b.wait_finished(sent.id, 1)).state == "cancelled"
    assert await b.ack(d, decoded(d), None, 0.0, Finish("cancelled", 60)) is True
    assert (await rec(b, sent.id)).state == "cancelled"


async def test_cancel_a_running_job_asks_it_to_stop(contract_broker: Contract) -> None:
    b = contract_broker.broker
    sent = job(39)
    await b.publish([sent])
    d = await fetch_one(b)
    got, lease = await start(b, d)
    assert await b.cancel(sent.id) == "cancelling"
    info = await rec(b, sent.id)
    assert (info.state, info.cancel_requested, info.finished) == ("running", True, False)
    assert await b.cancel_requested(sent.id) is True
    assert await b.cancel(sent.id) == "cancelling"  # asked again: still on its way
    assert await b.ack(d, got, lease, 0.0, Finish("cancelled", 60)) is True
    ended = await rec(b, sent.id)
    assert (ended.state, ended.finished, ended.attempts) == ("cancelled", True, 1)


async def test_an_unknown_job_has_no_record(contract_broker: Contract) -> None:
    b = contract_broker.broker
    assert await b.record("no-such-job") is None
    assert await b.cancel("no-such-job") == "unknown"
    assert await b.cancel_requested("no-such-job") is False
    assert await b.job_state("no-such-job") is None
    with pytest.raises(aqw.UnknownJob):
        await b.wait_finished("no-such-job", 1)
    with pytest.raises(aqw.UnknownJob):
        await b.wait_finished("no-such-job", None)
    assert await b.record("no-such-job") is None  # asking created nothing


async def test_wait_finished_returns_wakes_and_times_out(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    first, second = job(40), job(41)
    await b.publish([first, second])
    # Several callers wait for one job: every one of them is woken by its ack.
    waiters = [asyncio.create_task(b.wait_finished(first.id, 10)) for _ in range(3)]
    if not kit.sqs:  # another broker of the queue waits on the same records
        other = await kit.consumer("c2")
        waiters.append(asyncio.create_task(other.wait_finished(first.id, 10)))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await b.wait_finished(second.id, 0.3)
    assert time.monotonic() - t0 >= 0.29
    assert not any(w.done() for w in waiters)

    deliveries = {decoded(d).id: d for d in await fetch_n(b, 2)}
    d = deliveries[first.id]
    got, lease = await start(b, d)
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)  # running is not an end
    finish = Finish("succeeded", 60, result="[1, 2]")
    assert await b.ack(d, got, lease, 0.0, finish) is True
    async with asyncio.timeout(5):
        ended = await asyncio.gather(*waiters)
    assert [(i.id, i.state, i.result) for i in ended] == [(first.id, "succeeded", [1, 2])] * len(
        waiters
    )
    # Finished already: at once.
    t0 = time.monotonic()
    assert (await b.wait_finished(first.id, 5)).state == "succeeded"
    assert (await b.wait_finished(first.id, None)).result == [1, 2]
    assert time.monotonic() - t0 < 1.0
    # A waiter that gives up (timeout, cancel) leaves nothing behind to wake later.
    pending = asyncio.create_task(b.wait_finished(second.id, None))
    await asyncio.sleep(0.05)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    d2 = deliveries[second.id]
    got2, lease2 = await start(b, d2)
    assert await b.ack(d2, got2, lease2) is True
    assert (await b.wait_finished(second.id, 1)).state == "succeeded"


async def test_records_expire_after_keep_for(contract_broker: Contract) -> None:
    b = contract_broker.broker
    acked, dead = job(42), job(43)
    await b.publish([acked, dead])
    by_id = {decoded(d).id: d for d in await fetch_n(b, 2)}
    got, lease = await start(b, by_id[acked.id])
    waiter = asyncio.create_task(b.wait_finished(acked.id, 10))
    await asyncio.sleep(0.05)
    assert await b.ack(by_id[acked.id], got, lease, 0.0, Finish(keep_for=0.3)) is True
    got2, lease2 = await start(b, by_id[dead.id])
    assert await b.dead_letter(by_id[dead.id], got2, failure(), 1, lease2, keep_for=0.3)
    assert (await waiter).state == "succeeded"  # woken with the record as it ended
    assert (await rec(b, acked.id)).state == "succeeded"
    assert (await rec(b, dead.id)).state == "dead"
    await asyncio.sleep(0.5)
    assert await b.record(acked.id) is None
    assert await b.record(dead.id) is None
    assert await b.cancel(acked.id) == "unknown"
    with pytest.raises(aqw.UnknownJob):
        await b.wait_finished(dead.id, 1)


async def test_a_refused_settle_leaves_the_record_as_it_was(contract_broker: Contract) -> None:
    b = contract_broker.broker
    sent = job(44)
    await b.publish([sent])
    d = await fetch_one(b)
    got, lease = await start(b, d)
    before = await rec(b, sent.id)
    # Another holder's lease: not the one that holds the job now.
    stale = Lease(b.job_lease_backend(got), b.job_lease_key(got), ttl=30)
    assert await b.ack(d, got, stale, 0.0, Finish("succeeded", 60, result="1")) is False
    assert await rec(b, sent.id) == before
    assert await b.retry(d, got.next_attempt(), time.time() + 60, stale, failure()) is False
    assert await rec(b, sent.id) == before
    assert await b.dead_letter(d, got, failure(), 1, stale) is None
    assert await rec(b, sent.id) == before
    assert await b.ack(d, got, lease) is True
    assert (await rec(b, sent.id)).state == "succeeded"


async def test_running_job_states_come_from_the_records(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    sent = job(45)
    await b.publish([sent])
    assert await b.job_state(sent.id) is None  # queued: not running
    d = await fetch_one(b)
    got, lease = await start(b, d)
    state = await b.job_state(sent.id)
    assert state is not None and set(state) == STATE_KEYS
    assert (state["state"], state["job_id"], state["task"], state["attempt"]) == (
        "running",
        sent.id,
        "work",
        "1",
    )
    assert (state["worker"], state["fencing_token"]) == ("c1", str(lease.fencing_token))
    assert float(state["progress"]) == 0.0 and state["message"] == ""
    # The list of running jobs holds the ones whose state was published (the worker
    # publishes a job's once it has run a while; memory and SQS list every running one).

    # Progress, message and lease expiry go into the record; nothing else does.
    expires = time.time() + 25
    published = running(
        b, sent.id, lease, progress="0.5", message="half", lease_expires_at=repr(expires)
    )
    await b.set_job_state(sent.id, {**published, "task": "other", "worker": "evil"}, 30)
    info = await rec(b, sent.id)
    assert (info.progress, info.message, info.task, info.worker) == (0.5, "half", "work", "c1")
    assert info.lease_expires_at is not None
    assert abs(info.lease_expires_at.timestamp() - expires) < 0.01
    state = await b.job_state(sent.id)
    assert state is not None and (state["progress"], state["message"]) == ("0.5", "half")
    assert await b.job_states() == [state]
    if not kit.sqs:  # SQS: in the broker object only
        other = await kit.consumer("c2")
        assert await other.job_state(sent.id) == state
        assert await other.job_states() == [state]
    # Another fencing token (a holder that lost the job), or none: nothing changes.
    wrong = str(lease.fencing_token + 1000)
    await b.set_job_state(sent.id, {**published, "fencing_token": wrong, "progress": "0.9"}, 30)
    without = {k: v for k, v in published.items() if k != "fencing_token"}
    await b.set_job_state(sent.id, {**without, "progress": "0.8"}, 30)
    assert (await rec(b, sent.id)).progress == 0.5
    await b.clear_job_state(sent.id)  # nothing to do: it still runs
    assert await b.job_state(sent.id) == state

    # The job ends: no longer running, and a late state never brings it back.
    assert await b.ack(d, got, lease, 0.0, Finish(keep_for=60)) is True
    done = await rec(b, sent.id)
    await b.set_job_state(sent.id, {**published, "progress": "0.99"}, 30)
    assert await rec(b, sent.id) == done
    assert done.state == "succeeded" and done.progress == 0.5
    assert await b.job_state(sent.id) is None
    assert await b.job_states() == []
    # Nor does a state create a record of a job it does not know.
    await b.set_job_state("no-such-job", running(b, "no-such-job", lease), 30)
    assert await b.record("no-such-job") is None
    assert await b.job_state("no-such-job") is None


async def test_a_running_job_whose_lease_lapsed_stays_listed_until_settled_or_taken_over(
    contract_broker: Contract,
) -> None:
    """Its worker died: its record still says running, so it stays listed as running, its
    lease expiry in the past (the monitor reports it as orphaned), until its job is settled
    or another worker takes it over (then it is listed as that worker's, with a lease
    expiry ahead). SQS: the job records are the broker object's own (the module docstring),
    so a takeover by another consumer cannot show there; only the settled case runs."""
    kit = contract_broker
    b = kit.broker
    alive, gone, ended = job(46), job(47), job(48)
    await b.publish([alive, gone, ended])
    by_id = {decoded(d).id: d for d in await fetch_n(b, 3)}
    _, lease_a = await start(b, by_id[alive.id])
    _, lease_g = await start(b, by_id[gone.id], ttl=0.3)  # lapses soon: nobody renews it
    _, lease_e = await start(b, by_id[ended.id])
    lapsed = time.time() - 10
    # The worker published the states (Redis lists a job once its state was published).
    await b.set_job_state(alive.id, running(b, alive.id, lease_a), 30)
    for sent, lease in ((gone, lease_g), (ended, lease_e)):
        past = running(b, sent.id, lease, lease_expires_at=repr(lapsed))
        await b.set_job_state(sent.id, past, 30)

    for sent in (gone, ended):
        assert (await rec(b, sent.id)).state == "running"
        state = await b.job_state(sent.id)
        assert state is not None and state["worker"] == "c1"
        assert float(state["lease_expires_at"]) == pytest.approx(lapsed, abs=0.01)
    listed = {s["job_id"]: s for s in await b.job_states()}
    assert set(listed) == {alive.id, gone.id, ended.id}
    assert float(listed[alive.id]["lease_expires_at"]) > time.time()
    for sent in (gone, ended):
        assert float(listed[sent.id]["lease_expires_at"]) < time.time()  # orphaned
    assert len(await b.job_states(limit=1)) == 1

    # Settled (here by its own lease): no longer running, no longer listed.
    assert await b.ack(by_id[ended.id], ended, lease_e, 0.0, Finish(keep_for=60)) is True
    assert await b.job_state(ended.id) is None
    assert {s["job_id"] for s in await b.job_states()} == {alive.id, gone.id}
    if kit.sqs:
        assert await b.ack(by_id[gone.id], gone, lease_g) is True
        assert [s["job_id"] for s in await b.job_states()] == [alive.id]
        return

    # Taken over: once its lease key is gone, another worker recovers the entry and starts
    # the job: it is listed as that worker's, the lapsed expiry gone with the old holder.
    await asyncio.sleep(0.4)
    taker = await kit.consumer("c2")
    recovered = await taker.reclaim(10, lambda _: 0.0, 0.0)  # alive's lease is held: not it
    assert [decoded(d).id for d in recovered] == [gone.id]
    _, lease_t = await start(taker, recovered[0])
    assert lease_t.fencing_token > lease_g.fencing_token
    state = await b.job_state(gone.id)
    assert state is not None
    assert (state["worker"], state["fencing_token"]) == ("c2", str(lease_t.fencing_token))
    assert float(state["lease_expires_at"]) > time.time()
    listed = {s["job_id"]: s for s in await b.job_states()}
    assert set(listed) == {alive.id, gone.id}
    assert all(float(s["lease_expires_at"]) > time.time() for s in listed.values())
    # ...and settled by the new holder: off the list; the old holder's late ack is refused.
    assert await taker.ack(recovered[0], gone, lease_t) is True
    assert await b.ack(by_id[gone.id], gone, lease_g) is False
    assert [s["job_id"] for s in await b.job_states()] == [alive.id]
    assert (await rec(b, alive.id)).fencing_token == lease_a.fencing_token


# -- heartbeats (running-job states: see the job records) ---------------------------------------


async def test_heartbeats_round_trip_expire_and_withdraw(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker

    def beat(worker: str) -> dict[str, Any]:
        return {
            "worker": worker,
            "queue": kit.queue,
            "state": "running",
            "pid": 4242,
            "concurrency": 8,
            "in_flight": 1,
            "at": 1_700_000_000.5,
        }

    await b.publish_heartbeat("w-short", beat("w-short"), 0.3)
    await b.publish_heartbeat("w-long", beat("w-long"), 30)
    await b.publish_heartbeat("w-gone", beat("w-gone"), 30)

    async def by_worker() -> dict[str, dict[str, Any]]:
        return {h["worker"]: h for h in await b.heartbeats()}

    assert await by_worker() == {w: beat(w) for w in ("w-short", "w-long", "w-gone")}
    await b.remove_heartbeat("w-gone")
    assert set(await by_worker()) == {"w-short", "w-long"}
    other = await kit.consumer("c2")
    seen = {h["worker"] for h in await other.heartbeats()}
    assert seen == (set() if kit.sqs else {"w-short", "w-long"})  # SQS: see job states
    await asyncio.sleep(0.45)
    assert await by_worker() == {"w-long": beat("w-long")}


# -- errors ------------------------------------------------------------------------------------


async def test_transient_errors_include_connection_errors(contract_broker: Contract) -> None:
    kit = contract_broker
    transient = kit.broker.transient_errors
    assert ConnectionError in transient
    assert issubclass(TimeoutError, transient) and issubclass(OSError, transient)
    if isinstance(kit.broker, RedisBroker | PartitionedBroker):
        import redis.exceptions

        assert issubclass(redis.exceptions.ConnectionError, transient)
        assert issubclass(redis.exceptions.TimeoutError, transient)
    elif kit.sqs:
        from aqw.brokers.sqs import SQSUnavailable

        assert issubclass(SQSUnavailable, transient)
    else:
        assert isinstance(kit.broker, MemoryBroker)
    assert not issubclass(ValueError, transient)
