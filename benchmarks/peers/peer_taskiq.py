"""taskiq + taskiq-redis peer benchmark (Redis Streams broker), stock settings.

* broker = ``taskiq_redis.RedisStreamBroker(url)``: XADD to stream ``taskiq``,
  consumer group ``taskiq``, ``XREADGROUP COUNT 100 BLOCK 2000``, one XACK per
  message after the (dummy) result is saved - all taskiq-redis defaults.
* enqueue = ``await work.kiq(t)`` on a producer broker (``startup()`` declares
  the consumer group, at ``$``, before anything is enqueued).
* worker = a second broker instance (own connection pool, own consumer name, as
  a separate worker process would have) driven in-process through taskiq's
  Python API: ``taskiq.receiver.Receiver(broker, max_async_tasks=--concurrency)``
  and ``Receiver.listen(finish_event)`` - what ``taskiq worker`` runs per
  process, minus the process manager.  Stopped by setting ``finish_event``.

taskiq-redis needs ``redis>=8``; setup_peers.sh gives it its own venv:

    benchmarks/.venv-peers/peers/taskiq/bin/python benchmarks/peers/peer_taskiq.py

Phases, timeouts and output are those of ``_bench.py``.
"""

from __future__ import annotations

import asyncio
import logging

from _bench import Config, Recorder, Session, main
from taskiq import AsyncTaskiqDecoratedTask
from taskiq.receiver import Receiver
from taskiq_redis import RedisStreamBroker

GRACEFUL_STOP = 3.0
log = logging.getLogger("bench.taskiq")


WorkTask = AsyncTaskiqDecoratedTask[[float], None]


def make_broker(cfg: Config, rec: Recorder) -> tuple[RedisStreamBroker, WorkTask]:
    broker = RedisStreamBroker(url=cfg.url)

    @broker.task(task_name="work")
    async def work(t: float) -> None:
        await rec.job(t)

    return broker, work


class TaskiqSession:
    def __init__(self, cfg: Config, rec: Recorder) -> None:
        self.cfg = cfg
        self.rec = rec
        self.producer, self.work = make_broker(cfg, rec)
        self.worker_broker: RedisStreamBroker | None = None
        self.finish = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def enqueue(self, t: float) -> None:
        await self.work.kiq(t)

    async def start_worker(self) -> None:
        broker, _ = make_broker(self.cfg, self.rec)
        broker.is_worker_process = True
        self.worker_broker = broker
        receiver = Receiver(broker, max_async_tasks=self.cfg.concurrency, run_startup=True)
        self.task = asyncio.create_task(receiver.listen(self.finish))

    async def stop_worker(self) -> None:
        # Graceful stop first.  Observed here (taskiq 0.13.0, taskiq-redis 1.2.4,
        # redis-py 8.1): once the stream is idle, the prefetcher's cancel of its
        # pending XREADGROUP is absorbed and listen() never returns (cancelling
        # the listener doesn't help: it waits for that read in a shielded scope).
        # Disconnecting the worker broker's pool ends the read, so that is the
        # fallback.  Measurements are complete by then.
        self.finish.set()
        if self.task is None or self.worker_broker is None:
            return
        _, pending = await asyncio.wait({self.task}, timeout=GRACEFUL_STOP)
        if pending:
            log.warning(
                "taskiq Receiver.listen() did not return within %.0fs of finish_event;"
                " disconnecting the worker broker to stop it",
                GRACEFUL_STOP,
            )
            receiver_log = logging.getLogger("taskiq.receiver.receiver")
            level = receiver_log.level
            receiver_log.setLevel(logging.CRITICAL)  # the forced disconnect's traceback
            try:
                await self.worker_broker.shutdown()
                _, pending = await asyncio.wait({self.task}, timeout=GRACEFUL_STOP)
            finally:
                receiver_log.setLevel(level)
            if pending:
                self.task.cancel()
        else:
            await self.worker_broker.shutdown()
        if self.task.done() and not self.task.cancelled() and self.task.exception():
            log.info("taskiq Receiver ended with %r", self.task.exception())

    async def close(self) -> None:
        await self.producer.shutdown()


async def open_session(cfg: Config, rec: Recorder) -> Session:
    session = TaskiqSession(cfg, rec)
    await session.producer.startup()
    return session


if __name__ == "__main__":
    main("taskiq-redis", "taskiq-redis", open_session, deps=("taskiq", "redis", "hiredis"))
