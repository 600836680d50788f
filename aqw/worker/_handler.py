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
    timer = None
    stoppers: list[Canceller] = []  # made only when the job is cancelled: most never are
    if running is not None:
        if deadline is not None:
            timer = Canceller(running, deadline)
        task_ = running

        def stop() -> None:
            if not stoppers:
                stoppers.append(Canceller(task_, None))
                stoppers[0].fire(CANCELLED)

        ctx.on_cancel(stop)

    def expired() -> str | None:
        if lease is not None:
            lapsed = lease.lapsed()
            if lapsed is not None:
                return lapsed
        if ctx.cancelled:
            return CANCELLED
        if deadline is not None and loop.time() >= deadline:
            return TIMED_OUT
        return None

    def cancelled() -> Outcome:
        return Outcome("cancelled", JobCancelled(ctx.job.id))

    base = running.cancelling() if running is not None else 0
    guarded = Guarded(task.fn(*args, **kwargs), expired)
    others = base
    try:
        try:
            value = await guarded
        finally:
            ctx.on_cancel(None)
            if timer is not None:
                others = timer.close()
            for stopper in stoppers:
                others = stopper.close()
        if lease is not None and guarded.stopped is not None:
            lapsed = lease.lapsed()
            if lapsed is not None:  # it caught the stop and returned: still not done
                raise LeaseLost(lease.key, lapsed)
        if guarded.stopped == CANCELLED:
            return cancelled()  # it caught the stop and returned: stopped all the same
        if deadline is not None and loop.time() >= deadline:
            raise JobTimeout(f"handler ran longer than its timeout of {timeout}s")
    except HandlerStopped as stopped:
        if lease is not None and lease.lapsed() is not None:
            raise LeaseLost(lease.key, lease.lapsed() or str(stopped)) from None
        if ctx.cancelled:
            return cancelled()
        return classify(task, JobTimeout(f"handler ran longer than its timeout of {timeout}s"))
    except asyncio.CancelledError:
        if lease is not None and lease.lapsed() is not None:
            raise  # the lease's own guard turns this into LeaseLost
        if others > base:
            raise  # a stop from outside (shutdown): the job is handed back
        if ctx.cancelled:
            return cancelled()
        timed_out = (timer is not None and timer.fired) or guarded.stopped == TIMED_OUT
        if not timed_out:
            raise
        return classify(task, JobTimeout(f"handler ran longer than its timeout of {timeout}s"))
    except LeaseLost:
        raise  # e.g. refused by a fenced datastore write: not a failure of the job
    except Exception as exc:
        if ctx.cancelled and guarded.stopped == CANCELLED:
            return cancelled()  # it turned the stop into an error of its own
        return classify(task, exc)
    return Outcome("ok", value=value)


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
