"""The context handed to a handler that declares a ``ctx: aqw.Context`` parameter."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, MutableMapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from .brokers.batching import BATCH_INFO_HEADER, BatchInfo
from .errors import ConfigError
from .idempotency import SqlCompletionStore, context_effect
from .job import Job
from .lease import Lease

if TYPE_CHECKING:  # the cache's module loads redis-py
    from .cache import Cache

_log = logging.getLogger("aqw.job")

#: The most bytes of a progress update's ``detail`` as JSON (``ctx.progress``).
MAX_DETAIL = 4096


def job_fields(job: Job) -> dict[str, Any]:
    """The ``extra`` fields of every log record about ``job``: ``job_id``, ``task`` and
    ``attempt`` (what ``aqw``'s log formats and a JSON log pipeline key on)."""
    return {"job_id": job.id, "task": job.task, "attempt": job.attempt}


class JobLog(logging.LoggerAdapter[logging.Logger]):
    """A logger adapter that tags each record with a job's fields (``job_fields``), keeping
    the ``extra`` the caller passes as well (the job's fields win a clash)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(kwargs.get("extra") or {}), **(self.extra or {})}
        return msg, kwargs


class HostApp(Protocol):
    """What a job's context needs of the App: its queue and cache."""

    @property
    def queue(self) -> str: ...
    @property
    def cache(self) -> Cache | None: ...


class ContextHost(Protocol):
    """What a job's context needs of the worker running it."""

    @property
    def app(self) -> HostApp: ...
    @property
    def name(self) -> str: ...
    async def report_progress(
        self, ctx: Context, fraction: float, message: str, detail: str | None = None
    ) -> None: ...
    def resource_lock(self, name: str, *, ttl: float, wait: float | None) -> Lease: ...
    def settle_transaction(self, ctx: Context) -> AbstractAsyncContextManager[Any]: ...


class Context:
    """What a running job knows about itself.

    Attributes:
        job: the job envelope (id, task, attempt, headers, idempotency key).
        lease: the job's lease; ``lease.fencing_token`` orders writes across holders.
        worker: the worker running the job.
        log: a logger adapter (logger ``aqw.job``) that tags records with the job's
            ``job_id``, ``task`` and ``attempt`` as ``extra`` fields.
    """

    __slots__ = (
        "_cancelled",
        "_log",
        "_on_cancel",
        "_state",
        "delivery",
        "job",
        "lease",
        "worker",
    )

    def __init__(
        self, job: Job, lease: Lease | None, worker: ContextHost, delivery: Any = None
    ) -> None:
        self.job = job
        self.lease = lease
        self.worker = worker
        #: The broker's delivery of this attempt (what ``transaction`` settles).
        self.delivery = delivery
        self._state: dict[str, Any] | None = None
        self._log: JobLog | None = None
        self._cancelled = False
        self._on_cancel: Callable[[], None] | None = None

    @property
    def state(self) -> dict[str, Any]:
        """A dict the handler may keep its own values in for the run (made on first use)."""
        if self._state is None:
            self._state = {}
        return self._state

    @property
    def cancelled(self) -> bool:
        """True once ``app.cancel`` asked for this job to stop (seen at a lease renewal).
        The handler is then cancelled as well; a long computation between awaits may check
        this to stop sooner."""
        return self._cancelled

    def mark_cancelled(self) -> None:
        """Record that the job was cancelled and stop the handler (called by the worker when
        a lease renewal reports the cancellation)."""
        if not self._cancelled:
            self._cancelled = True
            if self._on_cancel is not None:
                self._on_cancel()

    def on_cancel(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` when the job is cancelled (the worker's handler runner uses it
        to stop the handler); None removes it."""
        self._on_cancel = callback
        if callback is not None and self._cancelled:
            callback()

    @property
    def batch(self) -> BatchInfo | None:
        """For a batch's callback (``app.batch(on_complete=...)``): the batch's counts as
        they were when it completed; None for any other job."""
        text = self.job.headers.get(BATCH_INFO_HEADER)
        return None if text is None else BatchInfo.from_json(text)

    @property
    def job_id(self) -> str:
        return self.job.id

    @property
    def queue(self) -> str:
        """The queue the job came from."""
        return self.worker.app.queue

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
            self._log = JobLog(_log, job_fields(self.job))
        return self._log

    async def progress(self, fraction: float, message: str = "", detail: Any = None) -> None:
        """Report progress (0.0-1.0) of this job, with a message and an optional small JSON
        ``detail`` (at most ``MAX_DETAIL`` bytes): in its record (``app.job(job_id)``) and,
        on a broker that streams it, to the readers of ``app.progress(job_id)``."""
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"ctx.progress(fraction): must be within 0..1, got {fraction!r}")
        if detail is None:
            await self.worker.report_progress(self, fraction, message)
            return
        try:
            wire = json.dumps(detail, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"ctx.progress(detail): must be JSON: {exc}") from None
        if len(wire) > MAX_DETAIL:
            raise ConfigError(f"ctx.progress(detail): at most {MAX_DETAIL} bytes as JSON")
        await self.worker.report_progress(self, fraction, message, wire)

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
        return context_effect(self, conn, store, key=key)

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """``async with ctx.transaction() as conn:`` a connection to the broker's database
        whose transaction also acks this job when the block ends cleanly: the handler's
        writes and the ack commit together or not at all. The ack checks the job lease's
        token: a holder whose lease another worker took rolls back (``aqw.LeaseLost``).
        PostgreSQL broker only (``docs/brokers/postgresql.md``)."""
        return self.worker.settle_transaction(self)
