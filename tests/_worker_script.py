"""What the worker processes of the tests (tests/crash_worker.py, tests/pause_worker.py,
tests/recovery_worker.py) share: the Redis they run on, a ledger entry stamped with the
Redis server's clock, and the run of one worker until SIGTERM that prints ``ready <pid>
<worker>`` once consuming and ``stopped <stats>`` once stopped.

Run as scripts (``python tests/<name>.py``), they import it from their own folder; it imports
nothing of pytest, so a worker process stays light.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any

from redis.asyncio import Redis

import aqw

#: The shared Redis (``AQW_TEST_REDIS_URL``, by default db 0), as in tests/_helpers.py.
REDIS_URL = os.environ.get("AQW_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"

#: KEYS[1] ledger; ARGV[1] the entry. Appends the entry with the server's clock after it.
TIMED_LEDGER_WRITE = """
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. t[1] .. '.' .. string.format('%06d', t[2]))
return 1
"""


def ledger_key(queue: str) -> str:
    """The ledger list, under the queue's hash tag (removed with the queue)."""
    return f"aqw:{{{queue}}}:ledger"


async def serve(
    app: aqw.App, ledger: Redis, *, concurrency: int, grace: float, **options: Any
) -> None:
    """Run one worker of ``app`` (with ``options``) until SIGTERM (or SIGINT), then close
    ``app`` and ``ledger``."""
    try:
        worker = app.worker(concurrency=concurrency, grace=grace, handle_signals=True, **options)
        await worker.start()
        print(f"ready {os.getpid()} {worker.name}", flush=True)
        try:
            await worker.wait_stopped()
        finally:
            await worker.stop()
        print(f"stopped {worker.stats.as_dict()}", flush=True)
    finally:
        await app.close()
        await ledger.aclose()


def run(main: Coroutine[Any, Any, None]) -> None:
    """The script's entry point: warnings and above on stderr, then ``main``."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main)
