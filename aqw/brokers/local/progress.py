"""A running job's progress updates as a stream (``ctx.progress`` -> ``app.progress``), kept
in this process for the in-memory broker: per job a capped list of the last
``PROGRESS_KEEP`` updates, and a wake-up for the readers waiting on it."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque

from .clock import clock
from .wakeup import Wakeup

#: Updates kept per job (older ones are dropped: a reader that lags this far loses them).
PROGRESS_KEEP = 1000
#: Jobs whose updates are kept (the least recently updated are dropped).
PROGRESS_JOBS = 10_000

Update = tuple[str, dict[str, str]]


class LocalProgress:
    """``ProgressStream`` in this process."""

    shared = False

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, deque[Update]] = OrderedDict()
        self._seq = 0
        self._changed = Wakeup()

    async def publish(self, job_id: str, update: dict[str, str]) -> None:
        updates = self._jobs.get(job_id)
        if updates is None:
            updates = self._jobs[job_id] = deque(maxlen=PROGRESS_KEEP)
            while len(self._jobs) > PROGRESS_JOBS:
                self._jobs.popitem(last=False)
        self._jobs.move_to_end(job_id)
        self._seq += 1
        updates.append((f"{self._seq:020d}", {**update, "at": repr(clock.time())}))
        self._changed.notify()

    async def read(self, job_id: str, after: str, block: float | None) -> list[Update]:
        """The job's updates after the id ``after`` ("0": all kept), waiting up to ``block``
        seconds for one when there is none (None: no wait)."""
        out = self._after(job_id, after)
        if out or not block:
            return out
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block
        while not out:
            if not await self._changed.wait(deadline - loop.time()):
                return out
            out = self._after(job_id, after)
        return out

    def _after(self, job_id: str, after: str) -> list[Update]:
        updates = self._jobs.get(job_id)
        if not updates:
            return []
        return [u for u in updates if u[0] > after]
