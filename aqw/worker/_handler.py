"""Running a handler and describing how it ended: success, a retry, or the dead-letter queue."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .._cancel import Canceller, Guarded
from ..context import Context
from ..errors import HandlerStopped, JobCancelled, JobTimeout, LeaseLost, Reject, Retry
from ..task import Task

TIMED_OUT = "the handler ran past its timeout"
CANCELLED = "the job was cancelled"


@dataclass(slots=True)
class Outcome:
    """What the handler's run asks the settle step to do."""

    kind: str  # "ok" | "skip" | "retry" | "dead" | "cancelled"
    error: BaseException | None = None
    delay: float | None = None
    #: The handler's return value ("ok").
    value: Any = None
    #: Seconds the handler ran (for the attempt's log line).
    duration: float = 0.0


class _Stops:
    """The stops a running handler answers to (its lease, its cancellation, its timeout),
    as one object rather than a closure each: one is made per job."""

    __slots__ = ("ctx", "deadline", "lease", "loop", "stopper", "task")

    def __init__(
        self,
        ctx: Context,
        deadline: float | None,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any] | None,
    ) -> None:
        self.ctx = ctx
        self.lease = ctx.lease
        self.deadline = deadline
        self.loop = loop
        self.task = task
        #: Made only when the job is cancelled: most never are.
        self.stopper: Canceller | None = None

    def expired(self) -> str | None:
        """Why the handler must not be resumed, or None (``Guarded`` asks at each resume)."""
        lease = self.lease
        if lease is not None:
            lapsed = lease.lapsed()
            if lapsed is not None:
                return lapsed
        if self.ctx.cancelled:
            return CANCELLED
        if self.deadline is not None and self.loop.time() >= self.deadline:
            return TIMED_OUT
        return None

    def stop(self) -> None:
        """``app.cancel`` asked for the job to stop: cancel the handler until it exits."""
        if self.stopper is None and self.task is not None:
            self.stopper = Canceller(self.task, None)
            self.stopper.fire(CANCELLED)


async def run_handler(task: Task[Any], payload: Any, ctx: Context) -> Outcome:
    """Call the handler under the task's timeout, the job's lease and its cancellation, and
    classify how it ended.

    All three stops are enforced the same way: the handler is cancelled when one comes and
    again until it has exited, it is not resumed after one has come (a handler paused or
    blocked past its lease runs no further statement), and a handler that returns normally
    after its timeout has still timed out: its result is not acknowledged."""
    args, kwargs = task.codec.call_args(payload, ctx)
    timeout = task.options.timeout
    lease = ctx.lease
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    running = asyncio.current_task()
    stops = _Stops(ctx, deadline, loop, running)
    timer = None
    if running is not None:
        if deadline is not None:
            timer = Canceller(running, deadline)
        ctx.on_cancel(stops.stop)

    base = running.cancelling() if running is not None else 0
    guarded = Guarded(task.fn(*args, **kwargs), stops.expired)
    others = base
    try:
        try:
            value = await guarded
        finally:
            ctx.on_cancel(None)
            if timer is not None:
                others = timer.close()
            if stops.stopper is not None:
                others = stops.stopper.close()
        if lease is not None and guarded.stopped is not None:
            lapsed = lease.lapsed()
            if lapsed is not None:  # it caught the stop and returned: still not done
                raise LeaseLost(lease.key, lapsed)
        if guarded.stopped == CANCELLED:
            return _cancelled(ctx)  # it caught the stop and returned: stopped all the same
        if deadline is not None and loop.time() >= deadline:
            raise JobTimeout(f"handler ran longer than its timeout of {timeout}s")
    except HandlerStopped as stopped:
        if lease is not None and lease.lapsed() is not None:
            raise LeaseLost(lease.key, lease.lapsed() or str(stopped)) from None
        if ctx.cancelled:
            return _cancelled(ctx)
        return classify(task, JobTimeout(f"handler ran longer than its timeout of {timeout}s"))
    except asyncio.CancelledError:
        if lease is not None and lease.lapsed() is not None:
            raise  # the lease's own guard turns this into LeaseLost
        if others > base:
            raise  # a stop from outside (shutdown): the job is handed back
        if ctx.cancelled:
            return _cancelled(ctx)
        timed_out = (timer is not None and timer.fired) or guarded.stopped == TIMED_OUT
        if not timed_out:
            raise
        return classify(task, JobTimeout(f"handler ran longer than its timeout of {timeout}s"))
    except LeaseLost:
        raise  # e.g. refused by a fenced datastore write: not a failure of the job
    except Exception as exc:
        if ctx.cancelled and guarded.stopped == CANCELLED:
            return _cancelled(ctx)  # it turned the stop into an error of its own
        return classify(task, exc)
    return Outcome("ok", value=value)


def _cancelled(ctx: Context) -> Outcome:
    return Outcome("cancelled", JobCancelled(ctx.job.id))


def classify(task: Task[Any], exc: Exception) -> Outcome:
    """What a handler's exception asks for: a retry, or the dead-letter queue."""
    if isinstance(exc, Reject):
        return Outcome("dead", exc)
    if isinstance(exc, Retry):
        return Outcome("retry", exc, exc.delay)
    retryable = task.options.retry.is_retryable(exc) and not isinstance(exc, ValidationError)
    return Outcome("retry" if retryable else "dead", exc)


def describe(error: BaseException, payload_error: bool = False) -> str:
    """A one-line reason for logs and the dead-letter queue."""
    if isinstance(error, ValidationError):
        parts = []
        for err in error.errors(include_url=False)[:5]:
            where = ".".join(str(p) for p in err["loc"]) or "payload"
            parts.append(f"{where}: {err['msg']}")
        what = "payload failed validation" if payload_error else "ValidationError"
        return f"{what}: " + "; ".join(parts)
    if payload_error:
        return f"payload failed validation: {type(error).__name__}: {error}"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
