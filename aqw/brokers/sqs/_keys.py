"""Idempotency keys on SQS (``records=``): the enqueue and completion records of keyed jobs, in
a store the user names (Redis or PostgreSQL), since SQS has no place for them.

``enqueue(key=...)`` gives the same guarantee as on Redis: at most one job per key while its
record lives (``App(idempotency_ttl=...)``), atomic per key; a finished job's completion
record keeps the key taken; a redelivered finished job is skipped (``is_completed``). SQS and
the store cannot share a transaction, so an enqueue runs in three steps:

1. **claim** the key in the store for ``PENDING_TTL`` seconds (atomic: SET NX on Redis,
   INSERT ... ON CONFLICT on PostgreSQL); a key already taken returns its job's id, and
   nothing is sent;
2. **send** the message to SQS; if the send fails, the claim is released (only if it is still
   this job's) and the error re-raised;
3. **confirm**: the claim's life is extended to the idempotency TTL.

A producer that dies between 1 and 2 leaves a claim with no message: the key is free again
after ``PENDING_TTL`` seconds. One that dies between 2 and 3 leaves a sent job whose key frees
after ``PENDING_TTL`` seconds instead of the idempotency TTL. A send whose reply was lost (it
reached SQS, the caller saw an error) releases the key although its message exists. The ack
writes the completion record *before* it deletes the message: a worker that dies between the
two leaves a message that is redelivered and skipped as completed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from ...errors import ConfigError, extra_hint
from ...job import Job
from ..messages import ScheduleMark
from ._keys_redis import RedisKeyStore

log = logging.getLogger("aqw.sqs")

#: Seconds a key's claim lives before its job is sent (then it lives the idempotency TTL).
PENDING_TTL = 60.0

REDIS_SCHEMES = ("redis", "rediss", "unix")
POSTGRES_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@runtime_checkable
class KeyStore(Protocol):
    """Where the enqueue and completion records of idempotency keys live. Each method is one
    atomic step on the store, for key ``key`` of queue ``queue``; unreachable raises
    ``RecordsUnavailable``."""

    async def claim(self, queue: str, key: str, job_id: str, ttl: float) -> str | None:
        """Take ``key`` for ``job_id`` for ``ttl`` seconds unless an enqueue or completion
        record holds it: None when taken, else the id of the job that holds it."""

    async def confirm(self, queue: str, key: str, job_id: str, ttl: float) -> bool:
        """Extend ``job_id``'s claim to ``ttl`` seconds (taking the key again if the claim
        lapsed and nobody took it); False when another job holds it now."""

    async def release(self, queue: str, key: str, job_id: str) -> None:
        """Drop ``job_id``'s claim (its message was not sent); another job's stays."""

    async def complete(self, queue: str, key: str, job_id: str, ttl: float) -> None:
        """Write the completion record of ``key`` for ``ttl`` seconds."""

    async def is_completed(self, queue: str, key: str) -> bool:
        """True while ``key`` has a completion record."""

    async def close(self) -> None:
        """Close the store's connections."""


@runtime_checkable
class MarkStore(Protocol):
    """A ``records=`` store that also keeps the periodic tasks' schedule marks (both of
    aqw's stores do): then they are shared by every process, as on Redis."""

    async def read_marks(self, queue: str) -> dict[str, ScheduleMark]:
        """Every periodic task's last tick handled, of queue ``queue``."""

    async def advance_mark(self, queue: str, task: str, mark: ScheduleMark) -> None:
        """Record ``mark`` unless a later tick is recorded (it only moves forward)."""


class StoreMarks:
    """``SQSBroker.marks`` with a ``records=`` store that keeps marks: shared."""

    shared = True

    def __init__(self, keys: Keys) -> None:
        self._keys = keys

    def _store(self) -> MarkStore:
        store = self._keys.store()
        assert isinstance(store, MarkStore)
        return store

    async def read(self) -> dict[str, ScheduleMark]:
        return await self._store().read_marks(self._keys.queue)

    async def advance(self, task: str, mark: ScheduleMark) -> None:
        await self._store().advance_mark(self._keys.queue, task, mark)


def redact_url(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return "<unreadable URL>"


def scheme_of(url: str) -> str:
    found = _SCHEME.match(url)
    return found[1].lower() if found else ""


def check_records_url(url: str) -> str:
    """``url`` when it names a store for key records; else a ConfigError naming ``records=``."""
    if scheme_of(url) not in REDIS_SCHEMES + POSTGRES_SCHEMES:
        raise ConfigError(
            f"sqs:// option records= must be a redis://, rediss://, unix://, postgresql:// or "
            f"postgres:// URL, got {redact_url(url)!r}"
        )
    return url


def open_store(url: str) -> KeyStore:
    """The store of a ``records=`` URL (nothing is connected yet)."""
    if scheme_of(check_records_url(url)) in REDIS_SCHEMES:
        return RedisKeyStore(url)
    try:
        from ._keys_pg import PostgresKeyStore  # asyncpg: the optional 'postgres' extra
    except ImportError as exc:
        raise ConfigError(
            f"sqs:// option records={scheme_of(url)}://... needs asyncpg: "
            f"{extra_hint('postgres')} ({exc})"
        ) from exc
    return PostgresKeyStore(url)


class Keys:
    """SQSBroker's idempotency keys: ``publish_unique``, the completion record the ack
    writes, and ``is_completed``, on the ``records=`` store (None: keys are refused)."""

    def __init__(self, queue: str, store: KeyStore | str | None) -> None:
        self.queue = queue
        #: The ``records=`` URL, when the store is opened from one.
        self.url = check_records_url(store) if isinstance(store, str) else None
        self._given = None if isinstance(store, str) else store
        #: Made now (it connects on first use), so a missing driver fails at construction.
        self._store: KeyStore | None = open_store(store) if isinstance(store, str) else store

    @property
    def enabled(self) -> bool:
        return self.url is not None or self._given is not None

    @property
    def keeps_marks(self) -> bool:
        """True when the store keeps schedule marks too (aqw's Redis and PostgreSQL ones)."""
        return self.url is not None or isinstance(self._given, MarkStore)

    def redis_store(self) -> RedisKeyStore | None:
        """The store when it is aqw's Redis one (batches are counted there), else None."""
        if self._store is None:
            return None
        return self._store if isinstance(self._store, RedisKeyStore) else None

    def postgres_store(self) -> Any:
        """The store when it is aqw's PostgreSQL one (batches are counted there), else None."""
        if self.url is None or scheme_of(self.url) not in POSTGRES_SCHEMES:
            return None
        return self.store()

    def store(self) -> KeyStore:
        if self._store is None:
            if self.url is None:
                raise ConfigError(
                    f"sqs://{self.queue}: enqueue(key=...) needs a store for the records of "
                    "idempotency keys, which SQS cannot keep: add "
                    "records=redis://host:6379/0 (or records=postgresql://user@host/db) to the "
                    "sqs:// URL, or pass SQSBroker(records=...)"
                )
            self._store = open_store(self.url)
        return self._store

    async def close(self) -> None:
        if self._store is not None and self._store is not self._given:
            store, self._store = self._store, None
            await store.close()

    async def publish_unique(
        self, job: Job, ttl: float, send: Callable[[], Awaitable[None]]
    ) -> tuple[str, bool]:
        """Claim ``job.key``, ``send()`` the job, confirm the claim for ``ttl`` seconds: (the
        id of the job that holds the key, True when it was taken and nothing was sent)."""
        assert job.key is not None
        store = self.store()
        holder = await store.claim(self.queue, job.key, job.id, min(PENDING_TTL, ttl))
        if holder is not None:
            return holder, True
        try:
            await send()
        except BaseException:
            try:
                await store.release(self.queue, job.key, job.id)
            except Exception as exc:
                log.warning(
                    "sqs://%s: the send of job %s failed and its key %r could not be freed "
                    "(%r): it frees itself in %.0f s",
                    self.queue,
                    job.id,
                    job.key,
                    exc,
                    min(PENDING_TTL, ttl),
                )
            raise
        try:
            confirmed = await store.confirm(self.queue, job.key, job.id, ttl)
        except Exception as exc:  # the job is sent: report it enqueued, the key is shorter-lived
            log.error(
                "sqs://%s: job %s was sent but its key %r could not be kept for %.0f s (%r): "
                "it frees itself in %.0f s",
                self.queue,
                job.id,
                job.key,
                ttl,
                exc,
                min(PENDING_TTL, ttl),
            )
            return job.id, False
        if not confirmed:
            log.error(
                "sqs://%s: job %s was sent, but its key %r was taken by another job while "
                "the send took longer than %.0f s: both jobs are queued",
                self.queue,
                job.id,
                job.key,
                min(PENDING_TTL, ttl),
            )
        return job.id, False

    async def complete(self, job: Job | None, ttl: float) -> None:
        """Write ``job``'s completion record for ``ttl`` seconds, when it has a key and a
        store is configured."""
        if job is None or job.key is None or ttl <= 0 or not self.enabled:
            return
        await self.store().complete(self.queue, job.key, job.id, ttl)

    async def is_completed(self, job: Job) -> bool:
        if job.key is None or not self.enabled:
            return False
        return await self.store().is_completed(self.queue, job.key)
