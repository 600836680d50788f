"""saq peer benchmark (https://pypi.org/project/saq/), Redis queue, stock settings.

* enqueue = ``await queue.enqueue("work", t=t)`` on ``saq.Queue.from_url(url)``
  (a Lua script: job key + ``incomplete`` sorted set + ``queued`` list).
* worker = ``saq.Worker(worker_queue, functions=[("work", work)],
  concurrency=--concurrency)`` on a second queue instance (own connection pool,
  as a separate worker process would have), run in-process with
  ``Worker.start()`` and stopped with ``Worker.stop()``.  Each of the
  ``concurrency`` slots dequeues with ``BLMOVE queued -> active`` and updates
  the job record before and after running it; results kept (``ttl=600``).
* Everything else is saq's default (upkeep timers, ``dequeue_timeout=0``).

saq[redis] pins ``redis<8``; setup_peers.sh gives it its own venv:

    benchmarks/.venv-peers/peers/saq/bin/python benchmarks/peers/peer_saq.py

Phases, timeouts and output are those of ``_bench.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from _bench import Config, Recorder, Session, main
from saq import Queue, Worker


class SaqSession:
    def __init__(self, cfg: Config, rec: Recorder, queue: Queue) -> None:
        self.cfg = cfg
        self.rec = rec
        self.queue = queue
        self.worker_queue: Queue | None = None
        self.worker: Worker[Any] | None = None
        self.task: asyncio.Task[None] | None = None

    async def enqueue(self, t: float) -> None:
        await self.queue.enqueue("work", t=t)

    async def start_worker(self) -> None:
        rec = self.rec

        async def work(ctx: Any, *, t: float) -> None:
            await rec.job(t)

        self.worker_queue = Queue.from_url(self.cfg.url)
        await self.worker_queue.connect()
        self.worker = Worker(
            self.worker_queue,
            functions=[("work", work)],
            concurrency=self.cfg.concurrency,
        )
        self.task = asyncio.create_task(self.worker.start())

    async def stop_worker(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.worker_queue is not None:
            await self.worker_queue.disconnect()

    async def close(self) -> None:
        await self.queue.disconnect()


async def open_session(cfg: Config, rec: Recorder) -> Session:
    queue = Queue.from_url(cfg.url)
    await queue.connect()
    return SaqSession(cfg, rec, queue)


if __name__ == "__main__":
    main("saq", "saq", open_session, deps=("redis", "hiredis"))
