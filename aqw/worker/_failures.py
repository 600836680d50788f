"""Seeing repeated failures: error fingerprints with sliding-window counts, and a guard that
notices a task whose retries run away (a poisoned dependency) and slows it down."""

from __future__ import annotations

import hashlib
import logging
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType

from .._redact import redact_message
from ..errors import ConfigError

log = logging.getLogger("aqw.failures")


def fingerprint(exc: BaseException, handler_code: CodeType | None = None) -> str:
    """A short stable id for "this kind of error at this place": the exception type and the
    handler's frame that led to it (or the innermost frame when the handler is not in it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if handler_code is not None:
        for frame in frames:
            if frame.filename == handler_code.co_filename and frame.name == handler_code.co_name:
                where = f"{frame.filename}:{frame.name}:{frame.lineno}"
    if not where and frames:
        last = frames[-1]
        where = f"{last.filename}:{last.name}:{last.lineno}"
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return hashlib.sha1(f"{kind}|{where}".encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class ErrorCount:
    """How often one kind of error happened in a window."""

    fingerprint: str
    error_type: str
    message: str
    task: str
    count: int
    last_seen: float


#: Most characters of an error's message an ``ErrorTracker`` keeps.
MESSAGE_CHARS = 500


class ErrorTracker:
    """Counts errors per fingerprint over a sliding window (default 5 minutes).

    Each fingerprint keeps its last error's message, published in worker heartbeats: with
    ``redact`` (the default) it is ``aqw._redact.redact_message`` text, one line without
    payload values (a ``ValidationError`` lists locations and messages, not its inputs);
    ``redact=False`` keeps the raw ``str(exc)``. Either way cut to 500 characters.
    """

    def __init__(
        self,
        window: float = 300.0,
        clock: Callable[[], float] = time.time,
        *,
        redact: bool = True,
    ) -> None:
        self.window = window
        self.redact = redact
        self._clock = clock
        self._seen: dict[str, deque[float]] = {}
        self._last: dict[str, tuple[str, str, str]] = {}

    def record(self, exc: BaseException, task: str, handler_code: CodeType | None = None) -> str:
        """Count ``exc``; returns its fingerprint."""
        fp = fingerprint(exc, handler_code)
        times = self._seen.setdefault(fp, deque())
        times.append(self._clock())
        message = redact_message(exc, MESSAGE_CHARS) if self.redact else str(exc)[:MESSAGE_CHARS]
        self._last[fp] = (type(exc).__qualname__, message, task)
        self._trim(fp)
        return fp

    def count(self, fp: str) -> int:
        """Occurrences of ``fp`` within the window."""
        self._trim(fp)
        return len(self._seen.get(fp, ()))

    def top(self, n: int = 10) -> list[ErrorCount]:
        """The most frequent errors within the window, most frequent first."""
        out = []
        for fp in list(self._seen):
            self._trim(fp)
            times = self._seen.get(fp)
            if not times:
                self._seen.pop(fp, None)
                self._last.pop(fp, None)
                continue
            error_type, message, task = self._last[fp]
            out.append(ErrorCount(fp, error_type, message, task, len(times), times[-1]))
        out.sort(key=lambda e: (-e.count, -e.last_seen))
        return out[:n]

    def _trim(self, fp: str) -> None:
        times = self._seen.get(fp)
        if times is None:
            return
        horizon = self._clock() - self.window
        while times and times[0] < horizon:
            times.popleft()


class RunawayGuard:
    """Watches the retry rate of each task over a sliding window.

    When retries exceed ``threshold`` of the task's runs (with at least ``min_runs`` runs
    in the window), the task is *running away*: it is logged loudly once per window and, with
    ``action="slow"``, its retry delays are multiplied by ``slow_factor`` until the rate falls.
    """

    def __init__(
        self,
        *,
        window: float = 60.0,
        threshold: float = 0.5,
        min_runs: int = 20,
        action: str = "slow",
        slow_factor: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if action not in ("log", "slow"):
            raise ConfigError(f"RunawayGuard action must be 'log' or 'slow', got {action!r}")
        if not 0 <= threshold <= 1:
            raise ConfigError(f"RunawayGuard threshold must be within 0..1, got {threshold!r}")
        if window <= 0:
            raise ConfigError(f"RunawayGuard window must be > 0 seconds, got {window!r}")
        self.window = window
        self.threshold = threshold
        self.min_runs = min_runs
        self.action = action
        self.slow_factor = slow_factor
        self._clock = clock
        self._runs: dict[str, _Window] = {}
        self._warned: dict[str, float] = {}

    def record(self, task: str, retried: bool) -> None:
        """Count one settled run of ``task``; ``retried`` when it was scheduled to retry."""
        runs = self._runs.get(task)
        if runs is None:
            runs = self._runs[task] = _Window(self.window)
        now = self._clock()
        newest = runs.slots[-1] if runs.slots else None
        if newest is not None and newest[0] == int(now // runs.width):  # runs.add, inline:
            newest[1] += 1  # this runs once per job
            newest[2] += retried
            runs.runs += 1
            runs.retried += retried
        else:
            runs.add(now, retried, now - self.window)
        last = self._warned.get(task)
        if retried and self.running_away(task) and (last is None or now - last > self.window):
            self._warned[task] = now
            log.error(
                "task %r is retrying %.0f%% of its runs over the last %.0fs (threshold %.0f%%)%s",
                task,
                100 * self.retry_rate(task),
                self.window,
                100 * self.threshold,
                "; slowing its retries down" if self.action == "slow" else "",
            )

    def retry_rate(self, task: str) -> float:
        """Retries as a share of settled runs of ``task`` within the window."""
        runs = self._runs.get(task)
        if runs is None:
            return 0.0
        runs.trim(self._clock() - self.window)
        return runs.retried / runs.runs if runs.runs else 0.0

    def running_away(self, task: str) -> bool:
        """True while ``task``'s retry rate is above the threshold."""
        runs = self._runs.get(task)
        if runs is None:
            return False
        runs.trim(self._clock() - self.window)
        if runs.runs < self.min_runs:
            return False
        return self.retry_rate(task) > self.threshold

    def delay_factor(self, task: str) -> float:
        """How much to stretch the next retry delay of ``task``."""
        if self.action == "slow" and self.running_away(task):
            return self.slow_factor
        return 1.0


class _Window:
    """Outcomes counted in ``SLOTS`` time slots of ``width`` seconds, with running sums of runs
    and retries; slots older than the window are dropped from the left. Memory is bounded by
    the slots, not by the runs (a worker settling 10,000 jobs a second keeps 60 slots, not
    600,000 timestamps), and a run that lands in the newest slot allocates nothing."""

    __slots__ = ("retried", "runs", "slots", "width")

    #: Slots per window: the window is exact to within one slot (1 s of a 60 s window).
    SLOTS = 60

    def __init__(self, window: float) -> None:
        self.width = window / self.SLOTS
        self.slots: deque[list[int]] = deque()  # [slot number, runs, retries], oldest first
        self.runs = 0
        self.retried = 0

    def add(self, at: float, retried: bool, horizon: float) -> None:
        number = int(at // self.width)
        slots = self.slots
        if slots and slots[-1][0] == number:
            newest = slots[-1]
            newest[1] += 1
            newest[2] += retried
        else:
            slots.append([number, 1, int(retried)])
            self.trim(horizon)
        self.runs += 1
        self.retried += retried

    def trim(self, horizon: float) -> None:
        """Drop the slots that ended at or before ``horizon``."""
        slots, width = self.slots, self.width
        while slots and (slots[0][0] + 1) * width <= horizon:
            _, runs, retried = slots.popleft()
            self.runs -= runs
            self.retried -= retried
