"""The periodic tasks of an app as rows for people (``aqw cron list``, the dashboard): each
task's schedule, the last tick enqueued (the broker's schedule marks, shared on Redis) and the
next tick."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from .brokers.base import Broker
from .task import Task


class SchedulesApp(Protocol):
    """What the schedule rows need of the App: its broker and its tasks."""

    @property
    def broker(self) -> Broker: ...
    @property
    def tasks(self) -> Mapping[str, Task[Any]]: ...


async def schedule_rows(app: SchedulesApp, now: float | None = None) -> list[dict[str, Any]]:
    """One row per periodic task, by name: ``task``, ``schedule`` (described), ``last_tick``
    and ``last_job`` (None when no tick was enqueued yet) and ``next_tick`` (seconds since the
    epoch). One read of the broker (its schedule marks)."""
    marks = await app.broker.marks.read()
    at = time.time() if now is None else now
    rows: list[dict[str, Any]] = []
    for name in sorted(app.tasks):
        schedule = app.tasks[name].options.schedule
        if schedule is None:
            continue
        mark = marks.get(name)
        rows.append(
            {
                "task": name,
                "schedule": schedule.describe(),
                "last_tick": mark.tick if mark else None,
                "last_job": (mark.job_id or None) if mark else None,
                "next_tick": schedule.next_after(at),
            }
        )
    return rows
