"""The lease's deadline is its confirmed expiry, and a stop cannot be swallowed.

In-process, on the memory lease backend: a blocked loop past the lease, a body that swallows
cancellations, renewals that keep the deadline moving, and a task timeout that a handler
cannot outrun by catching ``CancelledError`` or by returning late.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

import aqw
from aqw._cancel import UNWIND, Canceller, Guarded
from aqw.brokers.memory import MemoryLeaseBackend
from aqw.errors import HandlerStopped
from tests._helpers import eventually


async def test_a_block_blocked_past_its_lease_is_stopped_at_its_next_await() -> None:
    ledger: list[str] = []
    lease = aqw.Lease(MemoryLeaseBackend(), "k", ttl=0.3)
    with pytest.raises(aqw.LeaseLost, match="expired"):
        async with lease:
            ledger.append("start")
            time.sleep(0.5)  # noqa: ASYNC251 - the loop is blocked past the confirmed expiry
            assert not lease.held
            for i in range(5):
                await asyncio.sleep(0.01)
                ledger.append(f"after {i}")
    assert ledger == ["start"]
    assert lease.lapsed() is not None


async def test_a_handler_blocked_past_its_lease_runs_no_statement_after_its_next_await() -> None:
    ledger: list[str] = []

    async def blocker(n: int) -> None:
        ledger.append("start")
        time.sleep(0.5)  # noqa: ASYNC251 - blocks the loop past the lease
        for i in range(5):
            await asyncio.sleep(0)  # a bare yield: resumed by the loop before any timer
            ledger.append(f"after {i}")

    app = _app_with(blocker, lease_ttl=0.3)
    await app.tasks[next(iter(app.tasks))].enqueue(1)
    async with app.worker(concurrency=1) as worker:
        await eventually(lambda: worker.stats.lease_lost, 5, "the lease to be lost")
    assert worker.stats.lease_lost >= 1
    assert "after 0" not in ledger
    assert worker.stats.processed == 0
    await app.close()


async def test_a_body_that_swallows_cancellation_is_cancelled_until_it_exits() -> None:
    lease = aqw.Lease(MemoryLeaseBackend(), "k", ttl=0.2)
    swallowed = 0
    with pytest.raises(aqw.LeaseLost):
        async with lease:
            await lease.backend.release(lease.key, lease.token)  # someone deletes the key
            for _ in range(1000):
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    swallowed += 1
                    if swallowed >= 3:
                        raise
    assert swallowed == 3  # cancelled again after each swallow, until the body gave up
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # every cancel was taken back


async def test_renewals_move_the_deadline_so_a_long_block_finishes() -> None:
    lease = aqw.Lease(MemoryLeaseBackend(), "k", ttl=0.3)
    async with lease:
        await asyncio.sleep(1.0)  # over three times the TTL
        assert lease.held
        assert lease.renewals >= 3
    assert lease.lost_reason is None


async def test_a_cancel_from_outside_wins_over_the_lost_lease() -> None:
    lease = aqw.Lease(MemoryLeaseBackend(), "k", ttl=0.2)

    async def body() -> None:
        async with lease:
            await lease.backend.release(lease.key, lease.token)
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_canceller_takes_back_its_cancellations() -> None:
    async def body() -> int:
        current = asyncio.current_task()
        assert current is not None
        canceller = Canceller(current, asyncio.get_running_loop().time() + 0.01)
        hits = 0
        for _ in range(5):
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                hits += 1
        assert canceller.close() == 0
        return hits

    assert await body() >= 3


async def test_guarded_escalates_a_swallowed_cancellation_to_a_stop() -> None:
    steps: list[int] = []
    cleaned: list[str] = []
    swallowed: list[int] = []
    deadline = asyncio.get_running_loop().time() + 0.1

    async def handler() -> None:
        try:
            for i in range(100):
                steps.append(i)
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    swallowed.append(i)  # a swallowed cancellation is no escape
                    continue
        finally:
            await asyncio.sleep(0)  # cleanup may await while it unwinds
            cleaned.append("done")

    def expired() -> str | None:
        return "late" if asyncio.get_running_loop().time() >= deadline else None

    guarded = Guarded(handler(), expired)
    with pytest.raises(HandlerStopped, match="late"):
        await guarded
    assert guarded.stopped == "late"
    assert cleaned == ["done"]
    assert len(swallowed) == 1  # then aqw.HandlerStopped, which it does not catch
    assert len(steps) <= 7  # about 0.1 s / 0.02 s before the deadline, one after the swallow


async def test_guarded_closes_a_handler_that_catches_the_stop() -> None:
    after: list[int] = []
    deadline = asyncio.get_running_loop().time() + 0.05

    async def handler() -> None:
        time.sleep(0.1)  # noqa: ASYNC251 - the loop is blocked past the deadline
        for i in range(1000):
            # the pathological handler under test: it swallows every stop it can catch
            with contextlib.suppress(asyncio.CancelledError, HandlerStopped):
                await asyncio.sleep(0.01)
            after.append(i)

    started = asyncio.get_running_loop().time()
    with pytest.raises(HandlerStopped):
        await Guarded(
            handler(),
            expired=lambda: "late" if asyncio.get_running_loop().time() >= deadline else None,
        )
    assert asyncio.get_running_loop().time() - started < UNWIND + 0.5
    assert len(after) < 1000


async def test_guarded_stops_a_handler_whose_cancel_wait_for_would_swallow() -> None:
    """Python 3.11: a cancellation thrown into ``asyncio.wait_for`` whose result is ready
    returns the result; the handler runs on to its next await, and is stopped there by
    ``aqw.HandlerStopped``, which is not a cancellation."""
    after: list[int] = []
    deadline = asyncio.get_running_loop().time() + 0.05

    async def fast() -> int:
        return 1

    async def handler() -> None:
        time.sleep(0.1)  # noqa: ASYNC251 - the loop is blocked past the deadline
        for i in range(50):
            await asyncio.wait_for(fast(), 5)
            after.append(i)

    def expired() -> str | None:
        return "late" if asyncio.get_running_loop().time() >= deadline else None

    with pytest.raises(HandlerStopped):
        await Guarded(handler(), expired)
    assert len(after) <= 1, after


def _app_with(handler: Any, **options: Any) -> aqw.App:
    app = aqw.App("memory://", queue="deadline")
    app.task(max_retries=0, **options)(handler)
    return app


@pytest.mark.parametrize("style", ["swallows", "returns-late", "awaits"])
async def test_a_timed_out_handler_is_never_acknowledged(style: str) -> None:
    finished: list[int] = []

    async def slow(n: int) -> None:
        if style == "swallows":
            for _ in range(50):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)
        elif style == "returns-late":
            time.sleep(0.1)  # noqa: ASYNC251 - nothing can stop it, but it is not done
        else:
            for _ in range(50):
                await asyncio.sleep(0.01)
        finished.append(n)

    app = _app_with(slow, timeout=0.02)
    task = app.tasks[next(iter(app.tasks))]
    for n in range(5):
        await task.enqueue(n)
    async with app.worker(concurrency=5, burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 20)
    assert worker.stats.processed == 0
    assert worker.stats.dead == 5
    dead = await app.broker.dlq_list()
    assert {d.error_type for d in dead} == {"JobTimeout"}
    if style == "awaits":
        assert finished == []
    await app.close()
