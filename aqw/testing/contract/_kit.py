"""What every contract test stands on: the broker under test (``Subject``, with its
``Traits``), the per-test kit (``Kit``: a connected consumer ``c1`` and more on demand) and
the helpers the tests share."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from ...brokers.base import Broker
from ...brokers.messages import Delivery, Failure
from ...job import Job
from ...lease import Lease
from ...record import JobInfo


@dataclass(frozen=True)
class Traits:
    """Where a broker legitimately differs from the in-process one, so the contract asserts
    its documented behaviour instead (each default: as the memory and Redis brokers).

    Args:
        visibility_lease: a delivery is itself a lease that times out (SQS visibility):
            ``reclaim`` recovers nothing and ``give_back_unstarted`` gives nothing back (a
            delivery comes back by itself), a job lease released with another token answers
            True (the holder keeps it), a second ack of a settled delivery may answer True,
            a retry cannot change the body, and every receive counts as an attempt.
        approximate_depth: ``depth()`` is approximate and settles within a few seconds; a
            delivery hidden by a retry counts as in flight; a scheduled job is delayed by
            the broker itself (``promote_due`` has nothing to move).
        delay: seconds of the short delays of retry and schedule tests (whole seconds on
            brokers that count delays so).
        block: seconds of one blocking fetch in the tests' fetch loops.
        transient: the client errors that must be among ``transient_errors``.
        window_lease: a delivery is this consumer's for a window the broker renews
            (``keep_alive``) and that runs out by itself, the delivery then coming back to
            the next fetch (JetStream's AckWait), while the body and the attempt are the
            job's own: ``reclaim`` recovers nothing; a holder that renewed keeps it, one
            that did not loses it, and its late settle is refused.
    """

    visibility_lease: bool = False
    approximate_depth: bool = False
    delay: float = 0.4
    block: float = 0.1
    transient: tuple[type[BaseException], ...] = ()
    window_lease: bool = False

    @property
    def comes_back(self) -> bool:
        """True when a delivery comes back by itself once its holder stops renewing it
        (``visibility_lease`` or ``window_lease``): nothing to reclaim."""
        return self.visibility_lease or self.window_lease


@dataclass
class Subject:
    """The broker under the contract, on one fresh queue.

    Args:
        new_broker: a new broker of the queue each call: another consumer, or another
            process's broker. It takes hints as keywords (``visibility=1``: seconds a
            delivery stays hidden, for the recovery tests), which a broker may ignore.
        queue: the queue's name.
        traits: how the broker legitimately differs (``Traits``).
    """

    new_broker: Callable[..., Broker]
    queue: str
    traits: Traits = field(default_factory=Traits)


@dataclass
class Kit:
    """One test's view: ``broker`` consumes the queue as ``c1``; ``consumer()`` adds more."""

    subject: Subject
    broker: Broker
    made: list[Broker] = field(default_factory=list)

    @property
    def queue(self) -> str:
        return self.subject.queue

    @property
    def traits(self) -> Traits:
        return self.subject.traits

    async def consumer(self, name: str = "c2", **hints: Any) -> Broker:
        """Another connected consumer of the same queue."""
        broker = self.subject.new_broker(**hints)
        self.made.append(broker)
        await broker.connect()
        await broker.start_consuming(name)
        return broker


class ContractBase:
    """The fixture of every contract class: ``kit``, from the ``subject`` fixture the user
    of the suite provides (in a conftest.py, or on the subclass)."""

    pytestmark = [pytest.mark.asyncio]

    @pytest_asyncio.fixture
    async def kit(self, subject: Subject) -> AsyncIterator[Kit]:
        kit = Kit(subject, subject.new_broker())
        kit.made.append(kit.broker)
        try:
            await kit.broker.connect()
            await kit.broker.start_consuming("c1")
            yield kit
        finally:
            for broker in kit.made:
                with contextlib.suppress(Exception):
                    await broker.close()


# -- helpers ---------------------------------------------------------------------------------


def job(n: int = 1, **fields: Any) -> Job:
    return Job(task="work", payload={"n": n}, **fields)


def decoded(delivery: Delivery) -> Job:
    return Job.decode(delivery.data)


async def eventually(
    check: Callable[[], Awaitable[Any]], within: float, what: str, every: float = 0.05
) -> Any:
    """``check()``'s first truthy result within ``within`` seconds, else AssertionError."""
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(every)


async def fetch_n(kit: Kit, broker: Broker, n: int, within: float = 5.0) -> list[Delivery]:
    """The next ``n`` deliveries (promoting due jobs while waiting), no more."""
    deadline = time.monotonic() + within
    got: list[Delivery] = []
    while len(got) < n:
        await broker.promote_due()
        got += await broker.fetch(n + 1 - len(got), kit.traits.block)  # one more than due shows
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {n} deliveries within {within}s")
    assert len(got) == n, f"expected {n} deliveries, got {len(got)}"
    assert len({d.id for d in got}) == n, "a delivery came twice"
    return got


async def fetch_one(kit: Kit, broker: Broker, within: float = 5.0) -> Delivery:
    """The next delivery (promoting due jobs while waiting); exactly one must come."""
    [delivery] = await fetch_n(kit, broker, 1, within)
    return delivery


async def nothing_to_fetch(broker: Broker) -> None:
    await broker.promote_due()
    assert await broker.fetch(10, 0) == []


async def assert_depth(kit: Kit, waiting: int, in_flight: int, delayed: int, dead: int) -> None:
    """Exact at once, or (``Traits.approximate_depth``) equal within a few seconds."""
    want = (waiting, in_flight, delayed, dead)

    async def now() -> tuple[int, int, int, int]:
        d = await kit.broker.depth()
        return (d.waiting, d.in_flight, d.delayed, d.dead)

    if not kit.traits.approximate_depth:
        assert await now() == want
        return
    got: list[tuple[int, int, int, int]] = []

    async def settled() -> bool:
        got.append(await now())
        return got[-1] == want

    try:
        await eventually(settled, 5.0, f"depth {want}")
    except AssertionError:
        raise AssertionError(f"depth stayed {got[-1]}, expected {want}") from None


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


async def start(b: Broker, d: Delivery, ttl: float = 30.0) -> tuple[Job, Lease]:
    """Take the job lease of ``d``'s job as the worker does: the start step of ``d``."""
    sent = decoded(d)
    lease = Lease(b.job_lease_backend(sent, None, d), b.job_lease_key(sent), ttl=ttl)
    await lease.acquire()
    return sent, lease


async def rec(b: Broker, job_id: str) -> JobInfo:
    info = await b.records.record(job_id)
    assert info is not None, f"no record of {job_id}"
    assert info.id == job_id and not info.damaged
    return info


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def sees_the_same(kit: Kit, shared: bool) -> bool:
    """True when another broker of the queue sees the same part: shared across processes,
    or the whole queue lives in this process."""
    return shared or kit.broker.in_process
