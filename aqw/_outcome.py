"""Running a handler and describing how it ended: success, a retry, or the dead-letter queue."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .errors import JobTimeout, LeaseLost, Reject, Retry

if TYPE_CHECKING:
    from .context import Context
    from .task import Task


@dataclass(slots=True)
class Outcome:
    """What the handler's run asks the settle step to do."""

    kind: str  # "ok" | "skip" | "retry" | "dead"
    error: BaseException | None = None
    delay: float | None = None


async def run_handler(task: Task[Any], payload: Any, ctx: Context) -> Outcome:
    """Call the handler under the task's timeout and classify how it ended."""
    args, kwargs = task.codec.call_args(payload, ctx)
    timeout = task.options.timeout
    try:
        if timeout is None:
            await task.fn(*args, **kwargs)
        else:
            scope = asyncio.timeout(timeout)
            try:
                async with scope:
                    await task.fn(*args, **kwargs)
            except TimeoutError:
                if not scope.expired():
                    raise
                raise JobTimeout(f"handler ran longer than its timeout of {timeout}s") from None
    except LeaseLost:
        raise  # e.g. refused by a fenced datastore write: not a failure of the job
    except Reject as exc:
        return Outcome("dead", exc)
    except Retry as exc:
        return Outcome("retry", exc, exc.delay)
    except Exception as exc:
        retryable = task.options.retry.is_retryable(exc) and not isinstance(exc, ValidationError)
        return Outcome("retry" if retryable else "dead", exc)
    return Outcome("ok")


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
