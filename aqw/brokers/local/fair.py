"""Fair shares between keys, kept in this process: the in-memory broker's turns
(``LocalFairShares``), with the rules of the Redis scripts (``fair_fetch.lua``).

Per priority level, start-time fair queueing over the keys with jobs waiting: the key with
the least start tag goes next (ties by key), and its tag grows by 1/weight per job picked.
A key that starts waiting is tagged max(clock, the finish tag it left with), where the
clock is the start tag of the last job picked, so it is never behind a key already waiting
and its first job is among the next (keys waiting) picks. Each pick is O(log keys).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence

from ...job import Job
from .priorities import LevelFifos


class FairLevel:
    """The fair turns of one priority level."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._jobs: dict[str, deque[tuple[str, bytes]]] = {}
        self._start: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._idle: dict[str, float] = {}
        self.clock = 0.0
        self.count = 0

    def add(self, key: str, weight: float, entry_id: str, data: bytes) -> None:
        waiting = self._jobs.get(key)
        if waiting is None:
            waiting = self._jobs[key] = deque()
            start = max(self.clock, self._idle.pop(key, self.clock))
            self._start[key] = start
            heapq.heappush(self._heap, (start, key))
        waiting.append((entry_id, data))
        self._weight[key] = weight
        self.count += 1

    def pick(self) -> tuple[str, bytes] | None:
        """The next job of the turn (entry id, data), or None when none waits."""
        while self._heap:
            start, key = heapq.heappop(self._heap)
            if self._start.get(key) != start:
                continue  # an old tag of a key picked since
            waiting = self._jobs[key]
            item = waiting.popleft()
            self.count -= 1
            self.clock = start
            finish = start + 1 / self._weight[key]
            if waiting:
                self._start[key] = finish
                heapq.heappush(self._heap, (finish, key))
            else:
                del self._jobs[key], self._start[key], self._weight[key]
                self._idle[key] = finish
            if not self._jobs:  # nothing waits: the turn starts over
                self._idle.clear()
                self.clock = 0.0
            elif len(self._idle) > 64 + 2 * len(self._jobs):  # tags at or below the clock
                self._idle = {k: f for k, f in self._idle.items() if f > self.clock}
            return item
        return None


class LocalFairShares:
    """``FairShares`` for the in-memory broker: its queue's turns, one ``FairLevel`` per
    priority level, moved to the level's FIFO as a fetch wants them (``fill``)."""

    shared = False

    def __init__(self, enqueued: Callable[[Job], None], notify: Callable[[], None]) -> None:
        self.levels: dict[int, FairLevel] = {}
        self._enqueued = enqueued
        self._notify = notify
        self._ids = 0

    def __len__(self) -> int:
        return sum(level.count for level in self.levels.values())

    async def publish(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            assert job.fairness_key is not None
            level = self.levels.get(job.priority)
            if level is None:
                level = self.levels[job.priority] = FairLevel()
            self._ids += 1
            level.add(job.fairness_key, job.fairness_weight, f"f-{self._ids}", job.encode())
            self._enqueued(job)
        self._notify()

    def fill(self, fifos: LevelFifos, count: int) -> None:
        """Move picked jobs to ``fifos`` so that a take of ``count`` from the highest level
        down finds them: at each level, as many as its FIFO is short of what is left."""
        left = count
        for lv in sorted({*fifos.fifos, *self.levels}, reverse=True):
            if left <= 0:
                return
            fifo = fifos.fifos.get(lv)
            have = len(fifo) if fifo is not None else 0
            turns = self.levels.get(lv)
            while turns is not None and have < left:
                item = turns.pick()
                if item is None:
                    break
                fifos.add(item[0], item[1], lv)
                have += 1
            left -= have
