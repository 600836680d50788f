"""The NATS peers of ``benchmarks/nats_bench.py``, stock settings, from PyPI (never
vendored): taskiq-nats (``PullBasedJetStreamBroker`` and taskiq's ``Receiver`` at 100
concurrent tasks) and faststream (``NatsBroker``, a pull subscriber of batch 100). Each
drains N no-op jobs published first on a fresh stream. Runs in its own venv::

    python3 -m venv /tmp/peers-nats
    /tmp/peers-nats/bin/pip install 'faststream[nats]' taskiq-nats
    /tmp/peers-nats/bin/python benchmarks/peers/nats_peers.py [--jobs 3000] [--url nats://...]

Prints one JSON object: jobs/s per peer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid

import nats


async def _drop(url: str, stream: str) -> None:
    nc = await nats.connect(url)
    with contextlib.suppress(Exception):
        await nc.jetstream().delete_stream(stream)
    await nc.close()


async def taskiq_drain(url: str, n: int) -> float:
    from taskiq.receiver import Receiver
    from taskiq_nats import PullBasedJetStreamBroker

    name = f"TQ_{uuid.uuid4().hex[:8]}"
    broker = PullBasedJetStreamBroker(
        servers=[url], subject=f"{name}.jobs", stream_name=name, durable="taskiq"
    )
    done = asyncio.Event()
    count = [0]

    @broker.task
    async def noop() -> None:
        count[0] += 1
        if count[0] >= n:
            done.set()

    await broker.startup()
    await asyncio.gather(*(noop.kiq() for _ in range(n)))
    finish = asyncio.Event()
    receiver = Receiver(broker, max_async_tasks=100, run_startup=False)
    start = time.perf_counter()
    listening = asyncio.create_task(receiver.listen(finish))
    await asyncio.wait_for(done.wait(), 300)
    rate = n / (time.perf_counter() - start)
    finish.set()
    listening.cancel()
    with contextlib.suppress(BaseException):
        await listening
    await broker.shutdown()
    await _drop(url, name)
    return rate


async def faststream_drain(url: str, n: int) -> float:
    from faststream.nats import JStream, NatsBroker, PullSub

    name = f"FS_{uuid.uuid4().hex[:8]}"
    broker = NatsBroker(url)
    stream = JStream(name, subjects=[f"{name}.jobs"])
    done = asyncio.Event()
    count = [0]

    @broker.subscriber(
        f"{name}.jobs", stream=stream, durable="fs", pull_sub=PullSub(batch_size=100)
    )
    async def noop(body: dict[str, object]) -> None:
        count[0] += 1
        if count[0] >= n:
            done.set()

    await broker.connect()
    js = broker._connection.jetstream()  # publish the backlog before the subscriber starts
    await js.add_stream(name=name, subjects=[f"{name}.jobs"])
    await asyncio.gather(*(js.publish(f"{name}.jobs", b"{}") for _ in range(n)))
    start = time.perf_counter()
    await broker.start()
    await asyncio.wait_for(done.wait(), 300)
    rate = n / (time.perf_counter() - start)
    await broker.stop()
    await _drop(url, name)
    return rate


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="nats://127.0.0.1:4222")
    p.add_argument("--jobs", type=int, default=3000)
    a = p.parse_args()
    out = {
        "taskiq-nats": await taskiq_drain(a.url, a.jobs),
        "faststream": await faststream_drain(a.url, a.jobs),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
