"""Priority levels on NATS JetStream: the priority tests every broker passes
(``tests/test_priorities.py``; not the debounced one: no debounce on NATS), run against the
real server with a ``backend`` of this broker, and the layout a queue gets: its plain
subject and consumer until a level is used."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import nats
import pytest

from aqw.brokers.nats._layout import TRANSIENT
from aqw.job import Job
from tests.test_priorities import (  # noqa: F401 - collected here, on this broker
    test_a_crashed_workers_jobs_of_every_level_are_reclaimed,
    test_a_delayed_job_comes_due_at_its_own_level,
    test_a_failing_job_retries_and_succeeds_at_its_level,
    test_a_retry_and_a_dlq_replay_come_back_at_their_own_level,
    test_a_share_lets_lower_levels_run_under_a_steady_high_stream,
    test_a_stopped_queue_drains_highest_level_first_fifo_within_a_level,
    test_depth_sums_over_the_levels,
    test_high_jobs_behind_a_low_backlog_start_before_any_further_low_one,
    test_keep_alive_and_give_back_act_on_the_deliverys_level,
    test_strict_priority_never_runs_a_lower_level_while_the_higher_waits,
    test_the_task_default_and_an_enqueue_override,
)

from .conftest import URL, NatsBackend, Server, broker, new_queue

pytestmark = pytest.mark.timeout(60)


async def test_a_queue_without_priorities_keeps_its_subject_and_consumer(
    backend: NatsBackend,
) -> None:
    b = backend.broker()
    try:
        await b.publish([Job(task="t", payload=n) for n in range(3)])
        nc = await nats.connect(URL)
        js = nc.jetstream()
        try:
            names = b.names
            consumers = [c.name for c in await js.consumers_info(names.stream)]
            assert consumers == [names.consumer]
            info = await js.stream_info(names.stream, subjects_filter=">")
            assert info.state.subjects == {names.subject: 3}
            await b.publish([Job(task="t", payload="p", priority=3)])
            consumers = [c.name for c in await js.consumers_info(names.stream)]
            assert sorted(consumers) == [names.consumer, f"{names.consumer}-p3"]
            info = await js.stream_info(names.stream, subjects_filter=">")
            assert info.state.subjects == {names.subject: 3, f"{names.subject}.p3": 1}
        finally:
            await nc.close()
    finally:
        await b.close()


async def test_a_level_announced_after_a_server_restart_is_still_seen(
    private_server: Server,
) -> None:
    """The watch of the levels outlives a restart of the server: a worker connected before
    it reads a level a producer first uses after it."""
    queue = new_queue()
    worker = broker(queue, private_server.url, ack_wait=2.0)
    await worker.connect()
    private_server.kill()
    private_server.start()
    producer = broker(queue, private_server.url, ack_wait=2.0)
    try:
        await eventually_ok(lambda: producer.publish([Job(task="t", payload="p", priority=4)]))
        got: list[int] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(*TRANSIENT):
                got = [d.level for d in await worker.fetch(1, 0.2)]
        assert got == [4]
    finally:
        await producer.close()
        await worker.close()


async def eventually_ok(step: Callable[[], Awaitable[None]]) -> None:
    """``step`` run until it does not raise a transient error (the server is back)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            await step()
            return
        except TRANSIENT:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
