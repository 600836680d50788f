"""The dead-letter queue as an API: list, show, replay and purge dead jobs."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from ._producing import check_jobs
from .brokers.base import Broker, DeadJob
from .errors import ConfigError
from .task import Task


class DeadLetterApp(Protocol):
    """What the dead-letter API needs of the App: its broker, its tasks and their caps."""

    @property
    def broker(self) -> Broker: ...
    def get_task(self, name: str) -> Task[Any]: ...
    def payload_limit(self, task_name: str | None) -> int | None: ...


class DeadLetters:
    """Operations on an app's dead-letter queue (``app.dlq``)."""

    def __init__(self, app: DeadLetterApp) -> None:
        self.app = app
        self.broker = app.broker

    async def iterate(
        self, *, task: str | None = None, error_type: str | None = None, page: int = 500
    ) -> AsyncIterator[DeadJob]:
        """Every dead job, oldest first, optionally only of ``task`` / ``error_type``."""
        after: str | None = None
        while True:
            batch = await self.broker.dlq_list(page, after)
            for dead in batch:
                if task is not None and dead.task != task:
                    continue
                if error_type is not None and dead.error_type != error_type:
                    continue
                yield dead
            if len(batch) < page:
                return
            after = batch[-1].id

    async def list(
        self, *, task: str | None = None, error_type: str | None = None, limit: int = 100
    ) -> list[DeadJob]:
        """Up to ``limit`` dead jobs, oldest first, filtered by task and error type."""
        out: list[DeadJob] = []
        async for dead in self.iterate(task=task, error_type=error_type):
            out.append(dead)
            if len(out) >= limit:
                break
        return out

    async def get(self, entry_id: str) -> DeadJob | None:
        """One dead job by its DLQ entry id."""
        return await self.broker.dlq_get(entry_id)

    async def count(self) -> int:
        """How many dead jobs there are."""
        return (await self.broker.depth()).dead

    async def replay(
        self,
        ids: Iterable[str] = (),
        *,
        all: bool = False,
        task: str | None = None,
        edit_payload: Any = None,
        progress: Callable[[int, int], None] | None = None,
        batch: int = 200,
    ) -> int:
        """Put dead jobs back on the queue with their attempt count reset; returns how many.

        Select by ``ids``, or every entry (``all=True``), or every entry of ``task``.
        ``edit_payload`` replaces the payload (validated against the task first, and
        checked as an enqueue checks it: JSON, no nan, within the cap). A dead
        message that was never a valid job cannot be replayed and is skipped.
        """
        ids = list(ids)
        if not ids and not all and task is None:
            raise ConfigError("replay: name entry ids, or pass all=True or task=...")
        if ids:
            selected = [d for d in [await self.get(i) for i in ids] if d is not None]
        else:
            selected = [d async for d in self.iterate(task=task)]
        pairs = []
        for dead in selected:
            job = dead.job
            if job is None:
                continue
            payload = job.payload
            if edit_payload is not None:
                payload = self.app.get_task(job.task).validate(edit_payload)
            headers = {k: v for k, v in job.headers.items() if not k.startswith("aqw-")}
            fresh = job.model_copy(
                update={
                    "attempt": 1,
                    "payload": payload,
                    "headers": headers,
                    "enqueued_at": time.time(),
                }
            )
            if edit_payload is not None:  # what JSON cannot carry is refused, as at enqueue
                check_jobs(job.task, self.app.payload_limit(job.task), [fresh])
            pairs.append((dead.id, fresh))
        done = 0
        for start in range(0, len(pairs), batch):
            done += await self.broker.dlq_replay(pairs[start : start + batch])
            if progress is not None:
                progress(min(start + batch, len(pairs)), len(pairs))
        return done

    async def purge(
        self, *, older_than: float | None = None, ids: Iterable[str] = (), task: str | None = None
    ) -> int:
        """Delete dead jobs: the given ``ids``, or those that failed more than ``older_than``
        seconds ago (every one when 0), optionally only of ``task``; returns how many."""
        ids = list(ids)
        if not ids:
            if older_than is None and task is None:
                raise ConfigError("purge: name entry ids, or pass older_than= or task=")
            horizon = time.time() - (older_than or 0.0)
            ids = [
                d.id
                async for d in self.iterate(task=task)
                if older_than is None or d.last_failed_at <= horizon
            ]
        deleted = 0
        for start in range(0, len(ids), 500):
            deleted += await self.broker.dlq_delete(ids[start : start + 500])
        return deleted


def dead_job_json(dead: DeadJob) -> str:
    """A dead job as indented JSON (for ``aqw dlq show``). ``damaged`` lists the fields that
    could not be read (``DeadJob.damaged``; empty for an intact entry), and
    ``ensure_ascii`` writes every control character (ESC included) as a ``\\uXXXX`` escape, so
    what a hostile entry holds cannot drive the terminal it is shown on."""
    data = dead.as_dict()
    data["damaged"] = list(dead.damaged)
    job = dead.job
    data["job"] = json.loads(job.model_dump_json()) if job is not None else None
    return json.dumps(data, indent=2, default=str, ensure_ascii=True)
