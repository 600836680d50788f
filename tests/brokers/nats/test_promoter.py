"""The promoter's pulls end on the server before a pass returns (``_pull.py``). With
nats-py's ``fetch`` a pass often left its pull request open on nats-server 2.9.10, and a
nak'd delivery whose delay ran out meanwhile went into that broker's buffer, unseen until
its next pass (a stopped worker's: never, until the AckWait). Here a message published
right after one pull returned is taken by another's pull, every time, and after every pass
the promoter consumer has no pull request waiting while deliveries keep coming due."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from aqw.brokers.nats._layout import Layout
from aqw.brokers.nats._pull import NoWaitPull
from aqw.job import Job

from .conftest import URL, broker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def stream() -> AsyncIterator[tuple[Client, Client, str]]:
    one, two = await nats.connect(URL), await nats.connect(URL)
    js = one.jetstream()
    name = f"T_PULL_{uuid.uuid4().hex[:8]}"
    await js.add_stream(
        StreamConfig(name=name, subjects=[name], retention=RetentionPolicy.WORK_QUEUE)
    )
    config = ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=30)
    await js.add_consumer(name, config)
    try:
        yield one, two, name
    finally:
        await js.delete_stream(name)
        await one.close()
        await two.close()


async def test_a_message_sent_after_a_pull_returned_goes_to_the_next_pull(
    stream: tuple[Client, Client, str],
) -> None:
    one, two, name = stream
    first, second = NoWaitPull(one, name, "c"), NoWaitPull(two, name, "c")
    js = one.jetstream()
    for n in range(20):
        assert await first.take(256, 5.0) == []  # nothing there: answered at once
        await js.publish(name, str(n).encode())  # had its request stayed open, it took this
        [msg] = await second.take(256, 5.0)
        assert msg.data == str(n).encode()
        await msg.ack_sync()


async def test_a_pass_leaves_no_pull_request_open(nats_queue: str) -> None:
    b = broker(nats_queue, ack_wait=2.0)
    nc = await nats.connect(URL)
    names = Layout(nats_queue)
    try:
        await b.connect()
        soon = time.time() + 0.5
        for n in range(6):  # due one after another, nak'd until then by the passes
            await b.schedule([Job(task="work", payload={"n": n})], soon + 0.1 * n)
        await b.schedule([Job(task="work", payload={"n": 99})], time.time() + 3600)
        js = nc.jetstream()
        deadline = time.monotonic() + 30
        while (await b.depth()).delayed > 1:
            assert time.monotonic() < deadline, "the due jobs were not moved"
            await b.promote_due()
            info = await js.consumer_info(names.delayed_stream, names.promoter)
            assert info.num_waiting == 0, "a pass left its pull request open on the server"
            await asyncio.sleep(0.01)
        got = await b.fetch(20, 2)
        assert sorted(Job.decode(d.data).payload["n"] for d in got) == list(range(6))
    finally:
        await nc.close()
        await b.close()
