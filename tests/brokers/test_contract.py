"""The broker contract (``aqw.brokers.base.Broker``), one set of tests run against every broker:
the in-process ``MemoryBroker``, ``RedisBroker`` on fakeredis and on the real Redis, and
``SQSBroker`` on moto (server mode, tests/brokers/conftest.py).

Each test gets ``contract_broker``: a connected broker consuming a fresh queue as consumer
``c1``, and ``consumer()`` for more consumers of the same queue. Where a broker legitimately
differs, the test asserts the documented different behaviour and names the document:

- SQS (docs/brokers/sqs.md, the ``aqw.brokers.sqs`` package docstring): the visibility timeout
  is the lease, so ``reclaim`` recovers nothing (an unsettled message comes back by itself);
  a retry is a visibility change, so the body cannot change and the next attempt comes from
  ``ApproximateReceiveCount``, which every receive counts (a requeue too); messages hidden by a
  retry count as in flight; idempotency keys at enqueue raise ``ConfigError``; job states and
  heartbeats stay in the broker object (``Broker`` defaults, aqw/brokers/base.py); ``depth()``
  counts are approximate, so they are compared with a bounded wait.

SQS cases are kept to a handful of messages each: moto is slow under a backlog
(../shared/FIELD-NOTES.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import open_backend

import aqw
from aqw.brokers.base import Broker, Delivery, Failure
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(30)

KINDS = ["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.redis), "sqs"]

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


# -- running-job states and heartbeats ---------------------------------------------------------


async def test_job_states_round_trip_and_expire(contract_broker: Contract) -> None:
    kit = contract_broker
    b = kit.broker
    short = {"task": "work", "worker": "w-1", "started_at": "1700000000.5", "attempt": "1"}
    long = {**short, "attempt": "2"}
    await b.set_job_state("j-short", short, 0.3)
    await b.set_job_state("j-long", long, 30)
    assert await b.job_state("j-short") == short
    assert await b.job_state("j-long") == long
    assert await b.job_state("j-none") is None
    states = await b.job_states()
    assert sorted(s["attempt"] for s in states) == ["1", "2"]
    other = await kit.consumer("c2")
    if kit.sqs:
        # SQSBroker keeps the Broker defaults (aqw/brokers/base.py): states live in the broker
        # object, so another broker instance does not see them.
        assert await other.job_state("j-long") is None
    else:
        assert await other.job_state("j-long") == long
    await b.clear_job_state("j-long")
    assert await b.job_state("j-long") is None
    await asyncio.sleep(0.45)
    assert await b.job_state("j-short") is None
    assert await b.job_states() == []


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
    if isinstance(kit.broker, RedisBroker):
        import redis.exceptions

        assert issubclass(redis.exceptions.ConnectionError, transient)
        assert issubclass(redis.exceptions.TimeoutError, transient)
    elif kit.sqs:
        from aqw.brokers.sqs import SQSUnavailable

        assert issubclass(SQSUnavailable, transient)
    else:
        assert isinstance(kit.broker, MemoryBroker)
    assert not issubclass(ValueError, transient)
