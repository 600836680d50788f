"""A worker process for tests/test_retry_crash.py, killed with SIGKILL mid-settle.

    python tests/scripts/retry_crash_worker.py QUEUE MARKER MODE [LEASE_TTL]

It runs task ``fragile`` (always raises ValueError) from QUEUE on the real Redis. Its broker's
settle step is patched according to MODE, so the test can SIGKILL the process at an exact moment:

- ``retry-before`` / ``dead-before``: the step writes MARKER and blocks forever *before* sending
  anything (killed between the failure and the ZSET/DLQ write);
- ``retry-after`` / ``dead-after``: the step is sent, then it writes MARKER and blocks forever
  (killed after the write, before the worker learns the result).

Retry modes use ``max_retries=3``, dead modes ``max_retries=0``. Every handler run appends
``<attempt> <delivery pid>`` to MARKER + ".runs".
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import aqw
from aqw.brokers.redis import RedisBroker

REDIS_URL = os.environ.get("AQW_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


async def main(queue: str, marker: Path, mode: str, lease_ttl: float) -> None:
    step, when = mode.split("-")
    broker = RedisBroker(REDIS_URL, queue)
    app = aqw.App(
        broker,
        lease_ttl=lease_ttl,
        retry=aqw.RetryPolicy(max_retries=3 if step == "retry" else 0, base=0.01, cap=0.02),
    )
    runs = Path(f"{marker}.runs")

    @app.task(name="fragile")
    async def fragile(n: int, ctx: aqw.Context) -> None:
        with runs.open("a") as f:  # noqa: ASYNC230 - a tiny local write
            f.write(f"{ctx.attempt} {os.getpid()}\n")
        raise ValueError(f"fragile {n} failed")

    method = "retry" if step == "retry" else "dead_letter"
    original = getattr(broker, method)

    async def patched(*args: Any, **kwargs: Any) -> bool:
        if when == "after":
            await original(*args, **kwargs)
        marker.write_text(f"{step} {when} {os.getpid()}\n")  # noqa: ASYNC240
        await asyncio.Event().wait()  # block until SIGKILL
        raise AssertionError("unreachable")

    setattr(broker, method, patched)
    worker = app.worker(concurrency=1)
    await worker.run()


if __name__ == "__main__":
    queue, marker, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    ttl = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
    if mode not in ("retry-before", "retry-after", "dead-before", "dead-after"):
        raise SystemExit(f"unknown mode {mode!r}")
    asyncio.run(main(queue, marker, mode, ttl))
