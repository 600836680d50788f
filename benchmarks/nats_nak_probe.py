"""Plain nats-py probes of nak'd redeliveries on a pull consumer (docs/brokers/nats.md, "Why a
promoter pass asks without waiting"); no aqw. Against the local server (nats-server 2.9.10):

    python benchmarks/nats_nak_probe.py [URL] [SECONDS]

1. ``loops`` fetch loops (1, 2, 4) sharing one pull subscription, each ``fetch(256,
   timeout=0.05)`` and every message nak'd with a 0.2 s delay: deliveries the server made
   that no loop got (a jump in a message's delivery count), and the gaps between a message's
   deliveries.
2. How often a ``fetch(256, timeout=0.05)`` returns while its pull request is still open on
   the server (its 408 arrives after ``fetch`` returned).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import nats
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

TIMEOUTS = (asyncio.TimeoutError, nats.errors.TimeoutError)


async def _stream(js: nats.js.JetStreamContext) -> str:
    name = f"PROBE_{uuid.uuid4().hex[:8]}"
    await js.add_stream(
        StreamConfig(name=name, subjects=[name], retention=RetentionPolicy.WORK_QUEUE)
    )
    config = ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=30)
    await js.add_consumer(name, config)
    return name


async def shared_loops(url: str, loops: int, seconds: float) -> str:
    nc = await nats.connect(url)
    js = nc.jetstream()
    name = await _stream(js)
    sub = await js.pull_subscribe_bind("c", name)
    for i in range(10):
        await js.publish(name, str(i).encode())
    seen: dict[bytes, int] = {}
    last: dict[bytes, float] = {}
    gaps: list[float] = []
    missing = 0
    end = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal missing
        while time.monotonic() < end:
            try:
                msgs = await sub.fetch(256, timeout=0.05)
            except TIMEOUTS:
                msgs = []
            now = time.monotonic()
            for m in msgs:
                d = m.metadata.num_delivered or 0
                if m.data in seen:
                    missing += max(0, d - seen[m.data] - 1)
                    gaps.append(now - last[m.data])
                seen[m.data], last[m.data] = max(seen.get(m.data, 0), d), now
                await m.nak(delay=0.2)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(loop() for _ in range(loops)))
    await js.delete_stream(name)
    await nc.close()
    gaps.sort()
    return (
        f"{loops} loop(s) on one subscription: {sum(seen.values())} deliveries, {missing} "
        f"never seen; gaps p50 {gaps[len(gaps) // 2]:.3f} s, max {gaps[-1]:.3f} s"
    )


async def open_after_return(url: str, rounds: int = 40) -> str:
    nc = await nats.connect(url)
    js = nc.jetstream()
    name = await _stream(js)
    sub = await js.pull_subscribe_bind("c", name)
    late = 0
    for i in range(rounds):
        if i % 2 == 0:
            await js.publish(name, b"x")
        queue = sub._sub._pending_queue  # what arrives after fetch returned stays here
        try:
            for m in await sub.fetch(256, timeout=0.05):
                await m.ack()
        except TIMEOUTS:
            pass
        before = queue.qsize()
        await asyncio.sleep(0.02)
        if queue.qsize() > before:
            late += 1
        while not queue.empty():
            queue.get_nowait()
    await js.delete_stream(name)
    await nc.close()
    return f"{late}/{rounds} fetches returned while their pull request was still open"


async def main(url: str, seconds: float) -> None:
    for loops in (1, 2, 4):
        print(await shared_loops(url, loops, seconds))
    print(await open_after_return(url))


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1] if len(sys.argv) > 1 else "nats://127.0.0.1:4222",
            float(sys.argv[2]) if len(sys.argv) > 2 else 8.0,
        )
    )
