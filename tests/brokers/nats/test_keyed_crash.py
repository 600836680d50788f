"""An enqueue with an idempotency key whose producer is SIGKILLed between its steps: after the
key's claim (nothing published), or after the publish (the claim not confirmed). The next
enqueue of the key finds the claim pending and publishes the claimed job itself, under the
same ``Nats-Msg-Id``: the job exists exactly once, with the first producer's id and payload,
and later enqueues of the key are duplicates."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import nats
import pytest

from aqw.brokers.nats._layout import Layout
from aqw.job import Job

from .conftest import URL, broker

pytestmark = [pytest.mark.timeout(90), pytest.mark.xdist_group("processes")]

HERE = Path(__file__).parent


async def _killed_producer(queue: str, key: str, step: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE / "keyed_producer.py"),
        URL,
        queue,
        key,
        step,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == -signal.SIGKILL, f"the producer exited with {proc.returncode}"
    return out.decode().split()[0]


async def _jobs_in_stream(queue: str) -> int:
    nc = await nats.connect(URL)
    try:
        info = await nc.jetstream().stream_info(Layout(queue).stream)
        return int(info.state.messages)
    finally:
        await nc.close()


@pytest.mark.parametrize("step", ["claimed", "published"])
async def test_a_producer_killed_mid_enqueue_leaves_its_job_once(
    nats_queue: str, step: str
) -> None:
    first = await _killed_producer(nats_queue, "order-9", step)
    b = broker(nats_queue, ack_wait=2.0)
    try:
        assert await _jobs_in_stream(nats_queue) == (0 if step == "claimed" else 1)
        twin = Job(task="work", payload={"n": 2}, key="order-9")
        assert await b.publish_unique(twin, 600, None) == (first, True)
        again = Job(task="work", payload={"n": 3}, key="order-9")
        assert await b.publish_unique(again, 600, None) == (first, True)
        assert await _jobs_in_stream(nats_queue) == 1
        [delivery] = await b.fetch(10, 5)
        got = Job.decode(delivery.data)
        assert (got.id, got.payload) == (first, {"n": 1})  # the first producer's job
        record = await b.records.record(first)
        assert record is not None and record.state == "queued"
        assert await b.fetch(10, 0.2) == []
    finally:
        await b.close()
