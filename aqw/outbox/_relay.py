"""The relay: committed outbox rows become jobs on the app's brokers, each exactly once.

Every worker of an app with an outbox runs one (``aqw outbox relay`` runs one alone); they
compete for a leader lease (``lock_key("aqw-outbox")`` on the broker's lease backend,
renewed), and only the leader relays. One batch is one PostgreSQL transaction:

1. move the relay's fencing token forward (``fence.sql``): no row back means a newer leader
   has been here, so this relay stops leading and its transaction rolls back;
2. lock the oldest rows ``FOR UPDATE SKIP LOCKED`` (``claim.sql``);
3. publish each with an idempotency key: the producer's key, else
   ``outbox:<outbox id>:<row id>`` (``publish_unique``, atomic on the broker);
4. delete the rows and commit.

A relay killed anywhere in there leaves its rows in the table (the transaction never
committed); the next leader publishes them again and the broker answers "duplicate" for
those already out, so each committed row is one job. A rolled-back enqueue wrote no row
that anyone can see. The insert trigger's NOTIFY wakes the leader at once; without one
(a lost connection, a notification dropped) it looks again every ``poll`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .._text import error_line
from ..brokers import Broker
from ..errors import ConfigError, LeaseLost, LeaseUnavailable
from ..job import Job
from ..lease import Lease
from ._sql import migrate, statement

log = logging.getLogger("aqw.outbox")

#: The name of the relay's leader lease (``Broker.lock_key``).
RELAY_LOCK = "aqw-outbox"
#: Most seconds a stopping relay waits for its batch to commit.
STOP_WAIT = 5.0
#: Most seconds a failing relay waits before it tries again.
BACKOFF_MAX = 5.0


class RelayApp(Protocol):
    """What the relay needs of the App."""

    @property
    def broker(self) -> Broker: ...
    @property
    def idempotency_ttl(self) -> float: ...
    def broker_for(self, queue: str) -> Broker: ...


class RelaySettings(Protocol):
    """Where and how the relay reads: ``aqw.outbox.Outbox``."""

    schema: str
    batch: int
    poll: float
    leader_ttl: float

    async def connect(self) -> Any: ...


#: Called after each published batch, with its rows' (row id, job id, duplicate): for tests.
BatchHook = Callable[[list[tuple[int, str, bool]]], Awaitable[None]]


def check_relay(app: RelayApp) -> None:
    """Refuse an outbox on a broker that cannot enqueue with an idempotency key."""
    broker = app.broker
    if not broker.keyed_enqueue:
        raise ConfigError(
            f"the outbox needs a broker that enqueues with an idempotency key (each row "
            f"once), and the {broker.system} broker of queue {broker.queue!r} cannot: with "
            "SQS, add records=redis://... or postgresql://..."
        )


class Relay:
    """Relays ``settings``' outbox to ``app``'s brokers while it leads, until ``stop``."""

    def __init__(
        self,
        settings: RelaySettings,
        app: RelayApp,
        stop: asyncio.Event,
        name: str,
        *,
        after_batch: BatchHook | None = None,
    ) -> None:
        check_relay(app)
        self.settings = settings
        self.app = app
        self._stop = stop
        self.name = name
        self.leader = False
        self.relayed = 0
        self._after_batch = after_batch
        self._wake = asyncio.Event()
        self._migrated = False

    async def run(self) -> None:
        """Compete for the leader lease and relay while holding it; until ``stop``."""
        broker = self.app.broker
        key = broker.lock_key(RELAY_LOCK)
        pause = self.settings.poll
        while not self._stop.is_set():
            lease = Lease(broker.lease_backend(), key, ttl=self.settings.leader_ttl)
            try:
                await lease.acquire()
            except LeaseUnavailable:
                await self._sleep(self.settings.poll)
                continue
            except Exception as exc:
                log.warning("outbox relay %s could not take its lease: %s", self.name, exc)
                await self._sleep(self.settings.poll)
                continue
            try:
                async with lease:
                    self.leader = True
                    log.info("outbox relay %s leads (fence %d)", self.name, lease.fencing_token)
                    await self._lead(lease)
                pause = self.settings.poll
            except LeaseLost as exc:
                log.warning("outbox relay %s lost the leader lease: %s", self.name, exc)
            except Exception as exc:  # PostgreSQL or the broker unreachable, a bug
                log.warning("outbox relay %s failed: %s", self.name, error_line(exc))
                await self._sleep(pause)
                pause = min(pause * 2, BACKOFF_MAX)
            finally:
                self.leader = False

    async def _lead(self, lease: Lease) -> None:
        conn = await self.settings.connect()
        try:
            if not self._migrated:
                applied = await migrate(conn, self.settings.schema)
                if applied:
                    log.info("outbox migrations applied: %s", applied)
                self._migrated = True
            channel = f"aqw_outbox:{self.settings.schema}"
            await conn.add_listener(channel, self._notified)
            while not self._stop.is_set():
                self._wake.clear()
                moved = await self._whole_batch(conn, lease.fencing_token)
                if moved < self.settings.batch:  # the table is drained: wait to be woken
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.settings.poll)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(conn.close(timeout=2))

    async def _whole_batch(self, conn: Any, fence: int) -> int:
        """``relay_batch``, finished (committed or rolled back) even when the relay is
        stopped meanwhile: a stop then waits for the batch's commit, at most ``STOP_WAIT``
        seconds, and goes on (a batch cut short is published again, once, by the next)."""
        batch = asyncio.ensure_future(self.relay_batch(conn, fence))
        try:
            return await asyncio.shield(batch)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(batch, STOP_WAIT)
            raise

    def _notified(self, *_: object) -> None:
        self._wake.set()

    async def relay_batch(self, conn: Any, fence: int) -> int:
        """Relay one batch under fencing token ``fence``: the rows it moved."""
        schema, ttl = self.settings.schema, self.app.idempotency_ttl
        async with conn.transaction():
            instance = await conn.fetchval(statement("fence", schema), fence)
            if instance is None:
                raise LeaseLost(RELAY_LOCK, f"a newer relay holds a fence above {fence}")
            rows = await conn.fetch(statement("claim", schema), self.settings.batch)
            if not rows:
                return 0
            now = time.time()

            async def publish(row: Any) -> tuple[int, str, bool]:
                job = Job.decode(row["job"])
                if job.key is None:
                    job = job.model_copy(update={"key": f"outbox:{instance}:{row['id']}"})
                run_at = row["run_at"]
                due = run_at if run_at is not None and run_at > now else None
                broker = self.app.broker_for(row["queue"])
                job_id, duplicate = await broker.publish_unique(job, ttl, due)
                return row["id"], job_id, duplicate

            done = await asyncio.gather(*(publish(r) for r in rows))
            if self._after_batch is not None:
                await self._after_batch(done)
            await conn.execute(statement("delete", schema), [r["id"] for r in rows])
        self.relayed += len(rows)
        return len(rows)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
