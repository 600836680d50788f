"""The repair of what a killed nats-server leaves (``_repair.py``), against real servers:
acked messages a SIGKILLed server restored into its stream are purged, and an ack-pending
entry it left is cleared; the walk over a
stuck consumer's pending range acks only sequences that hold no message, leaving every
message there (in flight, or another level's, waiting) alone; and nothing is done when
nothing is wrong."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from aqw.brokers.nats._repair import STUCK_RUNS, Part, Repaired, Repairer
from aqw.job import Job

from .conftest import URL, Server, broker

pytestmark = pytest.mark.timeout(60)


def _ttl(_: Job | None) -> float:
    return 30.0


async def test_a_stuck_floor_is_walked_and_only_sequences_with_no_message_are_acked() -> None:
    """The walk over a consumer's pending range acks a sequence only when it holds no
    message at all: a work-queue stream removes the message of any sequence acked on it
    (pending or not, even another consumer's), and the range holds messages in flight and
    another level's waiting one. It runs when the floor has not moved since the last run."""
    nc = await nats.connect(URL)
    js = nc.jetstream(timeout=4)
    stream = f"aqw_test_repair_{uuid.uuid4().hex[:8]}"
    try:
        subject = f"{stream}.s"
        await js.add_stream(
            StreamConfig(
                name=stream,
                subjects=[subject, f"{subject}.*"],
                retention=RetentionPolicy.WORK_QUEUE,
            )
        )
        part = Part(stream, "c", subject)
        config = ConsumerConfig(
            durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=30, filter_subject=subject
        )
        await js.add_consumer(stream, config)
        for to in (subject, subject, f"{subject}.p1", subject, subject):
            await js.publish(to, b"x")
        sub = await js.pull_subscribe_bind("c", stream)
        [first] = await sub.fetch(1, timeout=5)  # 1: held, so the floor stays at 0
        [second] = await sub.fetch(1, timeout=5)
        await second.ack_sync()  # 2: acked, gone from the stream
        held = [first, *await sub.fetch(2, timeout=5)]  # 4 and 5
        assert [m.metadata.sequence.stream for m in held] == [1, 4, 5]

        repairer = Repairer(nc, js)
        sent: list[str] = []
        publish = nc.publish

        async def counted(subject: str, payload: bytes = b"", **kwargs: Any) -> None:
            if subject.startswith("$JS.ACK."):
                sent.append(subject.split(".")[5])  # the stream sequence acked
            await publish(subject, payload, **kwargs)

        nc.publish = counted  # type: ignore[method-assign]
        after_outage = Repairer(nc, js)
        after_outage.after_outage()  # a server may have restarted: its first run walks
        assert await after_outage.run([part]) == Repaired() and sent == ["2"]
        assert await after_outage.run([part]) == Repaired() and sent == ["2"]  # once
        sent.clear()
        for _ in range(STUCK_RUNS):  # the counts agree: no walk, until the floor is stuck
            assert await repairer.run([part]) == Repaired() and sent == []
        done = await repairer.run([part])  # walked
        assert sent == ["2"]  # not 3: it holds level 1's job
        assert (done.cleared, done.purged) == (0, 0)  # 2 was not pending

        info = await js.consumer_info(stream, "c")
        assert (info.num_ack_pending, info.num_pending, info.ack_floor.stream_seq) == (3, 0, 0)
        assert (await js.stream_info(stream)).state.messages == 4  # 1, 3, 4 and 5
        for msg in held:  # still the holder's
            await msg.ack_sync()
        assert (await js.stream_info(stream)).state.messages == 1  # level 1's, waiting
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def test_nothing_wrong_is_nothing_done(nats_queue: str) -> None:
    b = broker(nats_queue, ack_wait=30.0)
    try:
        await b.publish([Job(task="t", payload=n) for n in range(5)])
        await b.publish([Job(task="t", payload=9, priority=1)])
        await b.start_consuming("c1")
        got = await b.fetch(3, 2.0)
        assert len(got) == 3
        assert await b.reclaim(10, _ttl, 1.0) == []  # the worker's pass runs the repair
        repairer = Repairer(b._nc, b._jet())  # type: ignore[arg-type]
        for _ in range(STUCK_RUNS + 1):  # the last run finds the floor stuck and walks
            done = await repairer.run(b._repair_parts())
            assert (done.cleared, done.purged) == (0, 0)
        depth = await b.depth()
        assert (depth.waiting, depth.in_flight) == (3, 3)
    finally:
        await b.close()


async def _drain_killed_twice(nc: nats.NATS, server: Server, seed: int) -> Part:
    """A work queue of 8,000 messages acked at speed by four pullers on ``nc`` while
    ``server`` is SIGKILLed and restarted twice, then drained: the queue's part."""
    rng = random.Random(seed)
    js = nc.jetstream(timeout=4)
    part = Part("S", "c", "s")
    await js.add_stream(
        StreamConfig(
            name="S",
            subjects=["s"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        )
    )
    config = ConsumerConfig(
        durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=2, max_ack_pending=-1
    )
    await js.add_consumer("S", config)
    for _ in range(16):
        await asyncio.gather(*(js.publish("s", b"x") for _ in range(500)))
    sub = await js.pull_subscribe_bind("c", "S")

    async def pull() -> None:
        while True:
            try:
                msgs = await sub.fetch(100, timeout=0.5)
                await asyncio.gather(*(nc.request(m.reply, b"+ACK", timeout=2) for m in msgs))
            except Exception:  # the server is down, or an ack's answer was lost with it
                await asyncio.sleep(0.05)

    pullers = [asyncio.create_task(pull()) for _ in range(4)]
    try:
        for _ in range(2):
            await asyncio.sleep(0.3 + rng.random() * 0.5)
            server.kill()
            server.start()
        for _ in range(150):  # drained: nothing waiting, nothing in flight
            await asyncio.sleep(0.2)
            try:
                info = await js.consumer_info("S", "c")
            except Exception:
                continue
            if info.num_pending == 0 and info.num_ack_pending == 0:
                break
    finally:
        for task in pullers:
            task.cancel()
        await asyncio.gather(*pullers, return_exceptions=True)
    return part


async def test_what_a_killed_server_left_is_repaired(tmp_path: Path) -> None:
    """Measured on 2.9.10: every such run leaves acked messages in the stream (36 to 3,666
    of 20,000 in six runs), and some an ack-pending entry no delivery ever comes for. The
    repair, run as a worker runs it, leaves the stream holding exactly the messages the
    consumer holds or will deliver."""
    for attempt in range(3):
        server = Server(tmp_path / f"js{attempt}")
        server.start()
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        try:
            part = await _drain_killed_twice(nc, server, attempt)
            js = nc.jetstream(timeout=4)
            left = (await js.stream_info("S")).state.messages
            before = await js.consumer_info("S", "c")
            if not left and not before.num_ack_pending:
                continue
            repairer, purged, cleared = Repairer(nc, js), 0, 0
            for _ in range(STUCK_RUNS + 2):  # an entry under acked messages waits for the walk
                done = await repairer.run([part])
                purged, cleared = purged + done.purged, cleared + done.cleared
            after = await js.consumer_info("S", "c")
            state = (await js.stream_info("S")).state.messages
            held = int(after.num_pending) + int(after.num_ack_pending)
            seen = (
                f"left {left}, in flight {before.num_ack_pending} "
                f"(floor {before.ack_floor.stream_seq}, last {before.delivered.stream_seq}); "
                f"purged {purged}, cleared {cleared}; now {state} messages, {held} held"
            )
            print(seen)
            # Every message is one the consumer holds or will deliver, and every entry is a
            # message: none acked left over, none of a message gone. (A puller stopped with
            # a delivery leaves it in flight: counted on both sides.)
            assert state == held, seen
            if left > int(before.num_pending) + int(before.num_ack_pending):
                assert purged > 0, seen  # acked ones were left: the repair took them
            return
        finally:
            await nc.close()
            server.kill()
    pytest.skip("this nats-server left nothing to repair in three runs")
