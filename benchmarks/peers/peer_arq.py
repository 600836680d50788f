"""arq peer benchmark (https://pypi.org/project/arq/), stock settings.

* enqueue = ``ArqRedis.enqueue_job("work", t)`` on a pool from
  ``arq.create_pool`` (a WATCH/MULTI transaction: job key + sorted-set entry).
* worker = ``arq.worker.Worker(functions=[work], max_jobs=--concurrency,
  handle_signals=False)`` run in-process with ``Worker.async_run()``; it builds
  its own connection pool, as a separate worker process would.  Stopped with
  ``Worker.close()``.
* Everything else is arq's default, notably ``poll_delay=0.5`` s: arq polls its
  sorted set rather than blocking, so latency has a floor of up to one poll
  interval (see ``--poll-delay`` to explore it; the reported run uses the
  default).  Results are kept (``keep_result=3600``), as by default.

arq pins ``redis<6``; setup_peers.sh gives it its own venv:

    benchmarks/.venv-peers/peers/arq/bin/python benchmarks/peers/peer_arq.py

Phases, timeouts and output are those of ``_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

from _bench import REDIS_HOST, REDIS_PORT, Config, Recorder, Session, main
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import Worker, func

ARQ_DEFAULT_POLL_DELAY = 0.5


class ArqSession:
    def __init__(self, cfg: Config, rec: Recorder, pool: ArqRedis, poll_delay: float) -> None:
        self.cfg = cfg
        self.rec = rec
        self.pool = pool
        self.poll_delay = poll_delay
        self.worker: Worker | None = None
        self.task: asyncio.Task[None] | None = None

    async def enqueue(self, t: float) -> None:
        await self.pool.enqueue_job("work", t)

    async def start_worker(self) -> None:
        rec = self.rec

        async def work(ctx: dict[str, Any], t: float) -> None:
            await rec.job(t)

        self.worker = Worker(
            functions=[func(work, name="work")],
            redis_settings=settings(self.cfg),
            max_jobs=self.cfg.concurrency,
            handle_signals=False,
            poll_delay=self.poll_delay,
        )
        self.task = asyncio.create_task(self.worker.async_run())

    async def stop_worker(self) -> None:
        if self.worker is not None:
            # Let started jobs finish (close() would cancel them), then close(),
            # which with handle_signals=False cancels the polling loop.
            self.worker.allow_pick_jobs = False
            if running := list(self.worker.tasks.values()):
                await asyncio.wait(running, timeout=10)
            await self.worker.close()
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def close(self) -> None:
        await self.pool.aclose()


def settings(cfg: Config) -> RedisSettings:
    return RedisSettings(host=REDIS_HOST, port=REDIS_PORT, database=cfg.db)


def _split_argv() -> tuple[float, list[str]]:
    """Take our own ``--poll-delay`` off the command line; the rest is _bench's."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--poll-delay", type=float, default=ARQ_DEFAULT_POLL_DELAY)
    ours, rest = p.parse_known_args(sys.argv[1:])
    return ours.poll_delay, rest


if __name__ == "__main__":
    poll_delay, argv = _split_argv()

    async def open_session(cfg: Config, rec: Recorder) -> Session:
        return ArqSession(cfg, rec, await create_pool(settings(cfg)), poll_delay)

    main(
        "arq",
        "arq",
        open_session,
        deps=("redis", "hiredis"),
        argv=argv,
        extra_params={"poll_delay": poll_delay},
        epilog=f"arq only: --poll-delay SECONDS (default {ARQ_DEFAULT_POLL_DELAY}, arq's own)",
    )
