"""streaq peer benchmark (https://pypi.org/project/streaq/), Redis Streams, stock settings.

* Two ``streaq.Worker`` objects on the same queue, each with its own coredis
  client and the same ``work`` task registered: a producer (entered with
  ``async with``; enqueue = ``await work.enqueue(t)``, a Lua publish to the
  stream) and a consumer run in-process with ``Worker.run_async()``
  (``concurrency=--concurrency``, ``handle_signals=False``), which is what
  ``streaq run`` does per process.  The consumer is stopped by cancelling
  ``run_async()``.
* Everything else is streaq's default: pickle serialisation, prefetch =
  concurrency, results stored for 5 minutes, one pipelined ack/cleanup per task,
  idle-timeout renewal.

streaq uses coredis (no redis-py); setup_peers.sh gives it its own venv:

    benchmarks/.venv-peers/peers/streaq/bin/python benchmarks/peers/peer_streaq.py

Phases, timeouts and output are those of ``_bench.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from _bench import Config, Recorder, Session, main
from streaq import Worker

QUEUE = "bench"


def make_worker(cfg: Config, rec: Recorder) -> tuple[Worker[Any], Any]:
    worker: Worker[Any] = Worker(
        redis_url=cfg.url,
        queue_name=QUEUE,
        concurrency=cfg.concurrency,
        handle_signals=False,
    )

    @worker.task(name="work")
    async def work(t: float) -> None:
        await rec.job(t)

    return worker, work


class StreaqSession:
    def __init__(self, cfg: Config, rec: Recorder) -> None:
        self.cfg = cfg
        self.rec = rec
        self.producer, self.work = make_worker(cfg, rec)
        self.ready = asyncio.Event()
        self.done = asyncio.Event()
        # coredis binds its pool context to the task that enters it, so the
        # producer's ``async with`` lives (enters and exits) in this one task.
        self.host = asyncio.create_task(self._host_producer())
        self.task: asyncio.Task[None] | None = None

    async def _host_producer(self) -> None:
        async with self.producer:
            self.ready.set()
            await self.done.wait()

    async def enqueue(self, t: float) -> None:
        await self.work.enqueue(t)

    async def start_worker(self) -> None:
        consumer, _ = make_worker(self.cfg, self.rec)
        self.task = asyncio.create_task(consumer.run_async())

    async def stop_worker(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def close(self) -> None:
        self.done.set()
        await self.host


async def open_session(cfg: Config, rec: Recorder) -> Session:
    session = StreaqSession(cfg, rec)
    ready = asyncio.create_task(session.ready.wait())
    await asyncio.wait({ready, session.host}, return_when=asyncio.FIRST_COMPLETED)
    if session.host.done():  # entering the producer failed
        ready.cancel()
        await session.host
    return session


if __name__ == "__main__":
    main("streaq", "streaq", open_session, deps=("coredis",))
