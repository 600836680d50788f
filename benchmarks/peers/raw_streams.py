"""Raw redis-py Streams baseline: the "ceiling" a Streams job queue can approach.

No framework at all, just the minimum a reliable Streams consumer does:

* enqueue = one ``XADD`` of ``{"t": <time.time()>}`` to ``raw:stream``;
* the worker is one reader loop: ``XREADGROUP COUNT min(100, free slots) BLOCK
  1000`` for consumer group ``raw`` (created at id ``0`` so preloaded messages
  count), one asyncio task per message running the handler, at most
  ``--concurrency`` handlers in flight (the handler awaits ``rec.job(t)``, as
  every peer's does);
* finished message ids are acked by one acker task: each flush sends all ids
  completed since the last one as pipelined ``XACK``s of up to 100 ids.

Nothing else: no payload envelope, retries, leases, results or heartbeats.  The
producer and the worker use separate redis-py clients (``redis.asyncio`` with
hiredis when installed).  Run with the runner venv:

    benchmarks/.venv-peers/bin/python benchmarks/peers/raw_streams.py [--jobs N]

Phases, timeouts and output are those of ``_bench.py``.
"""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aioredis
from _bench import Config, Recorder, Session, main

STREAM = "raw:stream"
GROUP = "raw"
CONSUMER = "raw-1"
READ_COUNT = 100
ACK_BATCH = 100


class RawStreamsSession:
    def __init__(self, cfg: Config, rec: Recorder, producer: aioredis.Redis) -> None:
        self.cfg = cfg
        self.rec = rec
        self.producer = producer
        self.consumer: aioredis.Redis | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.to_ack: list[bytes] = []
        self.ack_wanted = asyncio.Event()
        self.slots = asyncio.Semaphore(cfg.concurrency)
        self.running: set[asyncio.Task[None]] = set()
        self.stopping = False

    async def enqueue(self, t: float) -> None:
        await self.producer.xadd(STREAM, {"t": repr(t)})

    async def handler(self, t: float) -> None:
        await self.rec.job(t)

    async def run_one(self, msg_id: bytes, fields: dict[bytes, bytes]) -> None:
        try:
            await self.handler(float(fields[b"t"]))
        finally:
            self.to_ack.append(msg_id)
            self.ack_wanted.set()
            self.slots.release()

    async def reader(self, client: aioredis.Redis) -> None:
        while not self.stopping:
            await self.slots.acquire()  # wait for at least one free slot
            free = 1
            while free < READ_COUNT and not self.slots.locked():
                await self.slots.acquire()
                free += 1
            reply = await client.xreadgroup(GROUP, CONSUMER, {STREAM: ">"}, count=free, block=1000)
            got = 0
            for _stream, messages in reply or ():
                for msg_id, fields in messages:
                    got += 1
                    task = asyncio.create_task(self.run_one(msg_id, fields))
                    self.running.add(task)
                    task.add_done_callback(self.running.discard)
            for _ in range(free - got):
                self.slots.release()

    async def acker(self, client: aioredis.Redis) -> None:
        # ``stopping`` as well as cancel(): a cancel that lands inside redis-py's
        # pipeline execute can be absorbed there (seen with redis-py 8.1), which
        # would leave this loop waiting for an ack_wanted that never comes.
        while not self.stopping:
            await self.ack_wanted.wait()
            self.ack_wanted.clear()
            ids, self.to_ack = self.to_ack, []
            async with client.pipeline(transaction=False) as pipe:
                for i in range(0, len(ids), ACK_BATCH):
                    pipe.xack(STREAM, GROUP, *ids[i : i + ACK_BATCH])
                await pipe.execute()

    async def start_worker(self) -> None:
        self.consumer = aioredis.from_url(self.cfg.url)
        self.tasks = [
            asyncio.create_task(self.reader(self.consumer)),
            asyncio.create_task(self.acker(self.consumer)),
        ]

    async def stop_worker(self) -> None:
        self.stopping = True
        tasks = [*self.tasks, *self.running]
        for task in tasks:
            task.cancel()
        self.ack_wanted.set()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for task in tasks:
            if task.done() and not task.cancelled():
                with contextlib.suppress(Exception):
                    task.result()
        if self.consumer is not None:
            await self.consumer.aclose()

    async def close(self) -> None:
        await self.producer.aclose()


async def open_session(cfg: Config, rec: Recorder) -> Session:
    producer = aioredis.from_url(cfg.url)
    await producer.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    return RawStreamsSession(cfg, rec, producer)


if __name__ == "__main__":
    main("raw-streams", "redis", open_session, deps=("redis", "hiredis"))
