"""Worker heartbeats kept in the process (``LocalWorkerStatus``, a ``WorkerStatus`` part that
is not shared): the memory broker shares one between the brokers of a queue in the process;
SQS keeps one per broker (other processes, ``aqw status`` among them, do not see them).
(Running-job states are read from the job records: ``records.py``.)"""

from __future__ import annotations

from typing import Any

from .clock import clock


class LocalWorkerStatus:
    """Expiring heartbeats, in memory."""

    __slots__ = ("_beats",)

    #: Kept in this process only.
    shared = False

    def __init__(self) -> None:
        self._beats: dict[str, tuple[dict[str, Any], float]] = {}

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        self._beats[worker] = (data, clock.monotonic() + ttl)

    async def heartbeats(self) -> list[dict[str, Any]]:
        now = clock.monotonic()
        for name in [n for n, (_, until) in self._beats.items() if until < now]:
            del self._beats[name]
        return [data for data, _ in self._beats.values()]

    async def remove_heartbeat(self, worker: str) -> None:
        self._beats.pop(worker, None)
