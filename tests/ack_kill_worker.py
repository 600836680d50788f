"""A worker process for tests/test_job_lifecycle_crash.py:
``python tests/ack_kill_worker.py QUEUE MARKER``.

Runs the ``work`` task (keep_result=True) on the real Redis (AQW_TEST_REDIS_URL). Its broker's
ack step SIGKILLs the process instead of sending, after writing ``MARKER``: the handler has
returned and its result is ready, but nothing was acknowledged.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from _worker_script import REDIS_URL, run

import aqw

LEASE_TTL = 1.0


def make_app(queue: str) -> aqw.App:
    app = aqw.App(REDIS_URL, queue=queue, lease_ttl=LEASE_TTL)

    @app.task(name="work", keep_result=True)
    async def work(n: int) -> int:
        return n * 10

    return app


async def main(queue: str, marker: Path) -> None:
    app = make_app(queue)

    async def ack(*args: Any, **kwargs: Any) -> bool:
        marker.write_text("handler returned; killed before the ack")  # noqa: ASYNC240
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    app.broker.ack = ack  # type: ignore[method-assign]
    async with app.worker(concurrency=1):
        await asyncio.sleep(60)  # killed long before


if __name__ == "__main__":
    run(main(sys.argv[1], Path(sys.argv[2])))
