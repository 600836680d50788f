"""Worker heartbeats kept in the process, for brokers with no shared store for them: the
``Broker`` defaults use one per broker instance (SQS, with or without a lock store: other
processes, ``aqw status`` among them, do not see them), and the memory broker shares one
between the brokers of a queue in the same process. (Running-job states are read from the
job records: ``_local_records.py``.)"""

from __future__ import annotations

import time
from typing import Any


class LocalStatus:
    """Expiring heartbeats, in memory."""

    __slots__ = ("_beats",)

    def __init__(self) -> None:
        self._beats: dict[str, tuple[dict[str, Any], float]] = {}

    def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        self._beats[worker] = (data, time.monotonic() + ttl)

    def heartbeats(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        for name in [n for n, (_, until) in self._beats.items() if until < now]:
            del self._beats[name]
        return [data for data, _ in self._beats.values()]

    def remove_heartbeat(self, worker: str) -> None:
        self._beats.pop(worker, None)
