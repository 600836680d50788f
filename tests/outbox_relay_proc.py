"""A relay in a process of its own, for the outbox's kill tests.

    python outbox_relay_proc.py REDIS_URL QUEUE PG_DSN SCHEMA MODE

MODE ``kill-after-publish``: relay one batch and SIGKILL this process once the batch is
published, before its rows are deleted (the worst moment). MODE ``run``: relay until killed, a
line ``published N`` after each batch published.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aqw
from aqw.outbox import Outbox, Relay


async def main(redis_url: str, queue: str, dsn: str, schema: str, mode: str) -> None:
    app = aqw.App(
        redis_url,
        queue=queue,
        outbox=Outbox(dsn, schema=schema, batch=50, poll=0.2, leader_ttl=0.5),
    )
    assert app.outbox is not None

    async def die(done: list[tuple[int, str, bool]]) -> None:
        print(f"published {len(done)}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    async def say(done: list[tuple[int, str, bool]]) -> None:
        print(f"published {len(done)}", flush=True)

    stop = asyncio.Event()
    relay = Relay(
        app.outbox,
        app,
        stop,
        f"proc-{os.getpid()}",
        after_batch=die if mode == "kill-after-publish" else say,
    )
    await app.broker.connect()
    await relay.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
