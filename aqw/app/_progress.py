"""``app.progress(job_id)``: follow a job's ``ctx.progress`` updates as they come, then its
end, without polling: the broker's ``progress`` part (a capped stream per job, read with a
blocking read) and its records' wait for the job's end, together."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from .._readback import to_float
from ..brokers import Broker
from ..errors import ConfigError, UnknownJob
from ..record import JobInfo

#: Seconds a reader's blocking read waits before it looks whether the job has ended.
READ_BLOCK = 1.0


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress update of a job (``state`` None), or its end (``state`` its final state,
    ``info`` its record)."""

    fraction: float | None
    message: str = ""
    detail: Any = None
    at: float | None = None
    state: str | None = None
    info: JobInfo | None = None

    @property
    def final(self) -> bool:
        return self.state is not None


class ProgressApp(Protocol):
    @property
    def broker(self) -> Broker: ...


def _update(fields: dict[str, str]) -> Progress:
    detail = fields.get("detail")
    try:
        parsed = json.loads(detail) if detail is not None else None
    except ValueError:
        parsed = None  # not written by aqw: left out
    return Progress(
        fraction=to_float(fields.get("fraction"), None),
        message=fields.get("message", ""),
        detail=parsed,
        at=to_float(fields.get("at"), None),
    )


def _end(info: JobInfo) -> Progress:
    return Progress(info.progress, info.message or "", None, None, info.state, info)


async def follow(app: ProgressApp, job_id: str) -> AsyncIterator[Progress]:
    """Each update of ``job_id``'s progress still kept, then each new one as it comes, in
    order, then its end. Raises ``aqw.UnknownJob`` (no record of it) and a ``ConfigError``
    on a broker that does not stream progress."""
    broker = app.broker
    stream = broker.progress
    if stream is None:
        raise ConfigError(f"app.progress: the {broker.system} broker does not stream progress")
    info = await broker.records.record(job_id)
    if info is None:
        raise UnknownJob(f"no record of job {job_id!r}")
    last = "0"
    ended: asyncio.Future[JobInfo] | None = None
    if not info.finished:
        ended = asyncio.ensure_future(broker.records.wait_finished(job_id, None))
    try:
        while True:
            done = ended is None or ended.done()
            updates = await stream.read(job_id, last, None if done else READ_BLOCK)
            for entry_id, fields in updates:
                last = entry_id
                yield _update(fields)
            if done and not updates:
                break
        yield _end(info if ended is None else ended.result())
    finally:
        if ended is not None and not ended.done():
            ended.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ended
