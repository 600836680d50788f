"""The periodic tasks' schedule marks kept in the process (``LocalScheduleMarks``, a
``ScheduleMarks`` part that is not shared): where the scheduler
(``aqw/worker/_scheduler.py``) keeps, per task, the last tick it handled. The memory broker
keeps one per queue; the Redis broker shares them in ``aqw:{q}:schedule``."""

from __future__ import annotations

from ..messages import ScheduleMark


class LocalScheduleMarks:
    """The schedule marks of one queue, in memory."""

    __slots__ = ("_marks",)

    #: Kept in this process only.
    shared = False

    def __init__(self) -> None:
        self._marks: dict[str, ScheduleMark] = {}

    async def read(self) -> dict[str, ScheduleMark]:
        return dict(self._marks)

    async def advance(self, task: str, mark: ScheduleMark) -> None:
        current = self._marks.get(task)
        if current is None or mark.tick >= current.tick:
            self._marks[task] = mark
