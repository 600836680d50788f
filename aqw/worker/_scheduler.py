"""The scheduler of periodic tasks (``@app.task(schedule=aqw.Cron(...) | aqw.Every(...))``).

Every worker runs one; they compete for a leader lease (``aqw.Lease`` on the broker's
``lease_backend()``, key ``lock_key("aqw-scheduler")``, renewed), and only the leader
enqueues. The leader computes the due ticks from its own clock and each task's persisted mark
(the last tick handled, ``Broker.schedule_marks``), so a new leader resumes where the last
one stopped, catching up at most ``catch_up`` missed ticks. Every tick is enqueued with the
idempotency key ``cron:<task>:<tick>``, so even two overlapping leaders (a paused ex-leader
that wakes up) write one job per tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._text import error_line
from ..brokers import Broker, ScheduleMark
from ..errors import ConfigError, LeaseLost, LeaseUnavailable
from ..lease import Lease
from ..schedule import Schedule, tick_iso, tick_key
from ..task import Task
from ._outage import Outage

log = logging.getLogger("aqw.scheduler")

#: The name of the leader lease (``Broker.lock_key``).
LEADER_LOCK = "aqw-scheduler"
#: Seconds the leader lease lives between renewals: a dead leader's successor takes over
#: within about this long.
LEADER_TTL = 3.0
#: Most seconds between two looks at the lease (a follower) or at the schedules (the leader).
POLL = 0.5
#: Backoff of one periodic task whose step fails (not the broker's: that is an outage):
#: first and longest pause, in seconds.
RETRY_FIRST = 1.0
RETRY_MAX = 60.0


@dataclass(slots=True)
class _Failing:
    """A periodic task whose step failed: when it is tried again, after which pause."""

    retry_at: float
    pause: float


class Scheduler:
    """Enqueues the ticks of ``tasks`` that have a schedule, while this worker leads."""

    def __init__(
        self,
        broker: Broker,
        tasks: Mapping[str, Task[Any]],
        stop: asyncio.Event,
        outage: Outage,
        worker: str,
        *,
        leader_ttl: float = LEADER_TTL,
        poll: float = POLL,
    ) -> None:
        self.broker = broker
        self.periodic = {n: t for n, t in tasks.items() if t.options.schedule is not None}
        self._stop = stop
        self.outage = outage
        self.worker = worker
        self.leader_ttl = leader_ttl
        self.poll = poll
        self.leader = False
        self._transient = broker.transient_errors
        #: The periodic tasks whose last step failed, and when each is tried again.
        self._failing: dict[str, _Failing] = {}

    def check(self) -> None:
        """Refuse periodic tasks on a broker that cannot enqueue with an idempotency key."""
        if not self.periodic:
            return
        broker = self.broker
        if not broker.keyed_enqueue:  # SQS: idempotency keys need its ``records=`` store
            names = ", ".join(sorted(self.periodic))
            raise ConfigError(
                f"periodic tasks ({names}) need a broker that enqueues with an idempotency "
                f"key (one job per tick), and the {broker.system} broker of queue "
                f"{broker.queue!r} cannot: with SQS, add records=redis://... or postgresql://..."
            )

    async def run(self) -> None:
        """Compete for the leader lease and, while holding it, enqueue due ticks; until the
        worker stops (cancelled with its other loops)."""
        if not self.periodic:
            return
        key = self.broker.lock_key(LEADER_LOCK)
        while not self._stop.is_set():
            lease = Lease(self.broker.lease_backend(), key, ttl=self.leader_ttl)
            try:
                await lease.acquire()
            except LeaseUnavailable:
                await self._sleep(self.poll)
                continue
            except self._transient as exc:
                self.outage.failed("taking the scheduler lease", exc)
                await self._sleep(self.poll)
                continue
            except Exception:
                log.exception("scheduler of worker %s could not take its lease", self.worker)
                await self._sleep(self.poll * 2)
                continue
            try:
                async with lease:
                    self.leader = True
                    log.info(
                        "scheduler of worker %s leads queue %r: %s",
                        self.worker,
                        self.broker.queue,
                        ", ".join(sorted(self.periodic)),
                    )
                    await self._lead()
            except LeaseLost as exc:
                log.warning("scheduler of worker %s lost the leader lease: %s", self.worker, exc)
            finally:
                self.leader = False

    async def _lead(self) -> None:
        while not self._stop.is_set():
            try:
                wait = await self.enqueue_due()
            except self._transient as exc:
                self.outage.failed("enqueueing periodic jobs", exc)
                wait = self.poll
            except Exception:  # a bug or a refused enqueue: say so, and try again later
                log.exception("scheduler of worker %s could not enqueue periodic jobs", self.worker)
                wait = self.poll * 2
            else:
                self.outage.ok()
            await self._sleep(max(0.001, min(wait, self.poll * 2)))

    async def enqueue_due(self, now: float | None = None) -> float:
        """Enqueue every periodic task's due ticks; seconds until the next tick. Each
        schedule on its own: one whose step fails (a refused enqueue, a bug) is said once
        and tried again with backoff, and the others go on; a broker error (an outage for
        all) is raised for ``_lead`` to report."""
        now = time.time() if now is None else now
        marks = await self.broker.schedule_marks()
        upcoming: list[float] = []
        for name, task in self.periodic.items():
            schedule = task.options.schedule
            assert schedule is not None
            failing = self._failing.get(name)
            if failing is not None and failing.retry_at > now:
                upcoming.append(failing.retry_at)
                continue
            try:
                await self._handle(name, task, schedule, marks.get(name), now)
                upcoming.append(schedule.next_after(now))
            except self._transient:
                raise
            except Exception as exc:
                upcoming.append(self._failed(name, schedule, exc, now))
            else:
                self._recovered(name)
        soonest = min(upcoming) if upcoming else now + self.poll
        return soonest - time.time() + 0.001

    async def _handle(
        self, name: str, task: Task[Any], schedule: Schedule, mark: ScheduleMark | None, now: float
    ) -> None:
        if mark is None:  # a new schedule starts at its next tick
            latest = schedule.latest(now)
            await self.broker.set_schedule_mark(name, ScheduleMark(latest or now))
            return
        await self._enqueue_ticks(task, schedule, mark, now)

    def _failed(self, name: str, schedule: Schedule, exc: Exception, now: float) -> float:
        """Put ``name`` off after its step raised ``exc``: said once (with the traceback),
        then tried again after 1 s, 2 s, ... up to ``RETRY_MAX``; when to look again."""
        failing = self._failing.get(name)
        pause = RETRY_FIRST if failing is None else min(failing.pause * 2, RETRY_MAX)
        if failing is None:
            log.error(
                "periodic task %s (%s) failed: %s; tried again with backoff (up to every "
                "%gs), the other periodic tasks go on",
                name,
                schedule.describe(),
                error_line(exc),
                RETRY_MAX,
                exc_info=exc,
            )
        else:
            log.debug("periodic task %s failed again: %s", name, error_line(exc))
        self._failing[name] = _Failing(now + pause, pause)
        return now + pause

    def _recovered(self, name: str) -> None:
        if self._failing.pop(name, None) is not None:
            log.info("periodic task %s ticks again", name)

    async def _enqueue_ticks(
        self, task: Task[Any], schedule: Schedule, mark: ScheduleMark, now: float
    ) -> None:
        last_job = mark.job_id
        for tick in schedule.due(mark.tick, now):
            when = tick_iso(tick)
            if schedule.skip_if_running and last_job and not await self._ended(last_job):
                log.info(
                    "periodic task %s: skipped the tick of %s: job %s has not ended",
                    task.name,
                    when,
                    last_job,
                )
            else:
                payload = task.codec.no_payload()
                enqueued = (await task.app.enqueue(task, [payload], key=tick_key(task.name, tick)))[
                    0
                ]
                if enqueued.duplicate:
                    log.debug(
                        "periodic task %s: the tick of %s was enqueued before", task.name, when
                    )
                else:
                    log.info(
                        "periodic task %s: enqueued job %s for the tick of %s",
                        task.name,
                        enqueued,
                        when,
                    )
                last_job = str(enqueued)
            await self.broker.set_schedule_mark(task.name, ScheduleMark(tick, last_job))

    async def _ended(self, job_id: str) -> bool:
        info = await self.broker.record(job_id)
        return info is None or info.finished

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
