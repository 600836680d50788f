"""Where the schedulers of periodic tasks (``aqw/worker/_scheduler.py``) keep, per task, the
last tick they handled, so a new leader resumes where the last one stopped. ``ScheduleMarks``
is the in-process default every ``Broker`` has; the Redis broker shares them
(``_redis_schedule.py``)."""

from __future__ import annotations

from typing import NamedTuple


class ScheduleMark(NamedTuple):
    """A periodic task's last tick handled (seconds since the epoch), and the id of the job
    last enqueued for it ("" when none is known)."""

    tick: float
    job_id: str = ""

    def encode(self) -> str:
        return f"{self.tick!r} {self.job_id}".rstrip()

    @classmethod
    def decode(cls, text: str) -> ScheduleMark | None:
        """The mark stored as ``text``; None when it does not parse."""
        tick, _, job_id = text.strip().partition(" ")
        try:
            return cls(float(tick), job_id)
        except ValueError:
            return None


class ScheduleMarks:
    """The schedule marks of one queue, kept in this broker object (one process only)."""

    _schedule_marks: dict[str, ScheduleMark]

    async def schedule_marks(self) -> dict[str, ScheduleMark]:
        """Per periodic task, the last tick handled (``aqw cron list`` reads them too)."""
        return dict(getattr(self, "_schedule_marks", {}))

    async def set_schedule_mark(self, task: str, mark: ScheduleMark) -> None:
        """Record ``mark`` as ``task``'s last tick handled, unless a later tick is recorded
        (a paused ex-leader that wakes up never moves a mark back)."""
        marks = self.__dict__.setdefault("_schedule_marks", {})
        current = marks.get(task)
        if current is None or mark.tick >= current.tick:
            marks[task] = mark
