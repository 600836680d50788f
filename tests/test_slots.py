"""A job whose handler has returned frees its slot as its settle starts (``worker/_slots.py``):
the next jobs start while the acks are on their way, the handlers running never pass
``concurrency``, and every job is settled once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aqw
from tests._helpers import run_burst


async def test_the_next_jobs_start_while_acks_are_on_their_way() -> None:
    app = aqw.App("memory://", queue=f"slots-{uuid.uuid4().hex[:8]}")
    running = most = settling = 0
    settling_at_start: list[int] = []
    acked: list[bool] = []

    @app.task(name="t")
    async def t(n: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        settling_at_start.append(settling)
        await asyncio.sleep(0.01)
        running -= 1

    ack = app.broker.ack

    async def slow_ack(*args: Any, **kwargs: Any) -> bool:
        nonlocal settling
        settling += 1
        try:
            await asyncio.sleep(0.05)  # a settle's round trip
            ok = await ack(*args, **kwargs)
            acked.append(ok)
            return ok
        finally:
            settling -= 1

    app.broker.ack = slow_ack  # type: ignore[method-assign]
    await t.enqueue_many(list(range(12)))
    await run_burst(app, concurrency=3)
    assert most == 3  # never more handlers at once than slots
    assert max(settling_at_start) > 0  # jobs started while earlier ones were settling
    assert acked == [True] * 12
    left = await app.broker.depth()
    assert (left.waiting, left.in_flight, left.dead) == (0, 0, 0)
    await app.close()


async def test_a_job_under_a_per_key_cap_keeps_its_slot_until_it_has_settled() -> None:
    """Its lease counts against the cap until its settle releases it: were its slot handed on
    at once, the next job of its key would start, be refused and be put off."""
    app = aqw.App("memory://", queue=f"slots-{uuid.uuid4().hex[:8]}")
    ran: list[int] = []

    @app.task(name="per_user", concurrency_key=lambda n: "user-1", max_per_key=1)
    async def per_user(n: int) -> None:
        ran.append(n)

    ack = app.broker.ack

    async def slow_ack(*args: Any, **kwargs: Any) -> bool:
        await asyncio.sleep(0.05)
        return await ack(*args, **kwargs)

    app.broker.ack = slow_ack  # type: ignore[method-assign]
    await per_user.enqueue_many(list(range(5)))
    worker = await run_burst(app, concurrency=1)
    assert ran == [0, 1, 2, 3, 4]
    assert worker.stats.deferred == 0
    await app.close()
