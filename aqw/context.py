"""The context handed to a handler that declares a ``ctx: aqw.Context`` parameter."""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .lease import Lease

if TYPE_CHECKING:
    from .cache import Cache
    from .idempotency import SqlCompletionStore
    from .job import Job
    from .worker._worker import Worker

_log = logging.getLogger("aqw.job")


class Context:
    """What a running job knows about itself.

    Attributes:
        job: the job envelope (id, task, attempt, headers, idempotency key).
        lease: the job's lease; ``lease.fencing_token`` orders writes across holders.
        worker: the worker running the job.
        log: a logger adapter that tags records with the job id and task.
    """

    __slots__ = ("_log", "job", "lease", "state", "worker")

    def __init__(self, job: Job, lease: Lease | None, worker: Worker) -> None:
        self.job = job
        self.lease = lease
        self.worker = worker
        self.state: dict[str, Any] = {}
        self._log: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def job_id(self) -> str:
        return self.job.id

    @property
    def task(self) -> str:
        return self.job.task

    @property
    def attempt(self) -> int:
        """1 on the first run, 2 on the first retry, and so on."""
        return self.job.attempt

    @property
    def cache(self) -> Cache:
        """The app's ``Cache`` (``App(cache=...)``); its hits and misses are counted."""
        cache = self.worker.app.cache
        if cache is None:
            raise ConfigError("ctx.cache: the app has no cache; pass App(..., cache=aqw.Cache(r))")
        return cache

    @property
    def fencing_token(self) -> int:
        """The job lease's fencing token (0 when the job runs without a lease)."""
        return self.lease.fencing_token if self.lease is not None else 0

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        if self._log is None:
            self._log = logging.LoggerAdapter(
                _log, {"job_id": self.job.id, "task": self.job.task, "attempt": self.job.attempt}
            )
        return self._log

    async def progress(self, fraction: float, message: str = "") -> None:
        """Report progress (0.0-1.0) of this job, readable by ``app.job_status(job_id)``."""
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"ctx.progress(fraction): must be within 0..1, got {fraction!r}")
        await self.worker.report_progress(self, fraction, message)

    def lock(self, name: str, *, ttl: float = 30.0, wait: float | None = 10.0) -> Lease:
        """A resource lease for use in the handler: ``async with ctx.lock("customer:7"):``.

        It is renewed while held, carries its own fencing token, cancels the block and raises
        ``aqw.LeaseLost`` if lost, and waits up to ``wait`` seconds for a busy resource
        (raising ``aqw.LeaseUnavailable`` after that; ``wait=None`` fails fast).
        """
        if not name:
            raise ConfigError("ctx.lock(name): name must be a non-empty string")
        return self.worker.resource_lock(name, ttl=ttl, wait=wait)

    def effect(
        self, conn: Any, store: SqlCompletionStore | None = None, *, key: str | None = None
    ) -> AbstractAsyncContextManager[bool]:
        """Guard this job's write to a SQL datastore so it commits once:
        ``async with conn.transaction(), ctx.effect(conn) as first_time:`` (write only when
        ``first_time``). Fenced by the job lease; see ``aqw.idempotency``."""
        from .idempotency import context_effect

        return context_effect(self, conn, store, key=key)
