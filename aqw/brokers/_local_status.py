"""Running-job states and worker heartbeats kept in the process, for brokers with no shared
store for them: the ``Broker`` defaults use one per broker instance (SQS, with or without a
lock store: other processes, ``aqw status`` among them, do not see them), and the memory
broker shares one between the brokers of a queue in the same process."""

from __future__ import annotations

import time
from typing import Any


class LocalStatus:
    """Expiring job states and heartbeats, in memory."""

    __slots__ = ("_beats", "_states")

    def __init__(self) -> None:
        self._states: dict[str, tuple[dict[str, str], float]] = {}
        self._beats: dict[str, tuple[dict[str, Any], float]] = {}

    def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        self._states[job_id] = (state, time.monotonic() + ttl)

    def clear_job_state(self, job_id: str) -> None:
        self._states.pop(job_id, None)

    def job_state(self, job_id: str) -> dict[str, str] | None:
        entry = self._states.get(job_id)
        if entry is None or entry[1] < time.monotonic():
            self._states.pop(job_id, None)
            return None
        return dict(entry[0])

    def job_states(self, limit: int) -> list[dict[str, str]]:
        now = time.monotonic()
        return [dict(state) for state, until in self._states.values() if until >= now][:limit]

    def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        self._beats[worker] = (data, time.monotonic() + ttl)

    def heartbeats(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        for name in [n for n, (_, until) in self._beats.items() if until < now]:
            del self._beats[name]
        return [data for data, _ in self._beats.values()]

    def remove_heartbeat(self, worker: str) -> None:
        self._beats.pop(worker, None)
