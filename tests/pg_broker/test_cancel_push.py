"""A cancel reaches the worker that runs the job at once on the PostgreSQL broker, not at its
next lease renewal: ``app.cancel`` of a running job notifies its id on the queue's cancels
channel in the cancel's transaction, and every worker of the queue listens there.

The job has a one-hour lease: its renewals, which also read the cancel mark, come minutes
apart (ttl/3), so a handler stopped with ``JobCancelled`` within 60 s of the cancel can only
come from the push. The cancel comes from another app (its own pool and listener), and is
asked again each second until the job ends (a notification is at most once: one sent
before the worker listens is not heard). Asserted on order and state, minutes of margin."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import aqw
from aqw.cli._job import stopping_line
from tests._helpers import eventually, running
from tests.pg_broker._backend import PgBackend, backend

__all__ = ["backend"]  # the fixture

pytestmark = pytest.mark.timeout(120)

#: The job's lease TTL, seconds.
LEASE = 3600.0


async def test_a_running_job_cancelled_stops_long_before_its_next_renewal(
    backend: PgBackend,
) -> None:
    app = backend.app(lease_ttl=LEASE)
    other = backend.app()  # another app's broker: the cancel goes through the server
    started = asyncio.Event()
    order: list[str] = []

    @app.task(name="long")
    async def long() -> None:
        order.append("started")
        started.set()
        try:
            await asyncio.sleep(2 * LEASE)
        except asyncio.CancelledError:
            order.append("stopped")
            raise
        order.append("slept")

    job_id = await long.enqueue()
    assert app.broker.pushes_cancels and "told now" in stopping_line(app, "long")
    async with running(app.worker()) as worker:
        await asyncio.wait_for(started.wait(), 30)

        async def stopped() -> bool:
            if await other.cancel(job_id) == "finished":
                return True
            with contextlib.suppress(TimeoutError, aqw.JobCancelled):
                await other.result(job_id, timeout=1.0)
            info = await other.job(job_id)
            return info is not None and info.state == "cancelled"

        await eventually(stopped, 60, "the handler stopped by the pushed cancel", interval=0)
        with pytest.raises(aqw.JobCancelled):
            await other.result(job_id, timeout=10)
        assert order == ["started", "stopped"]
        await eventually(lambda: worker.stats.cancelled == 1, 30, "counted")
        assert worker.stats.retried == 0 and worker.stats.dead == 0
