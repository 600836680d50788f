"""Batches and flows on SQS (``StoreBatchCounts``), kept in a ``records=redis://`` store: SQS
has no step a count could be part of, so the count is the store's atomic step, made by the
worker in the child's settle, *before* its message is deleted.

The batch's keys are the Redis broker's (``aqw:{q}:batch:<id>``, ``...:todo``,
``...:children``, the same ``batch_open.lua``, ``batch_seal.lua`` and ``batch_lib.lua``),
in the store. What differs:

- **Adding** is two steps: the children's membership (``sqs_batch_add.lua``), then their
  send to SQS; a send that fails takes the membership back (``sqs_batch_drop.lua``) and
  re-raises. A child is never sent uncounted; a producer killed between the two steps
  leaves members never sent, in a batch whose block never exited, so never sealed: it
  never completes (as a batch whose producer died inside the block never does anywhere).
- **Counting** (``sqs_batch_count.lua``) is made by the lease holder's settle (the ack or
  the dead-letter step checks the message is still held first), keeps the child's result
  in the store (a flow's later step reads it as its input) and counts it once, by
  membership. SQS's delete comes after the count: a worker killed between the two leaves a
  message that is received again, runs again, and counts nothing the second time. SQS has
  no fenced settle (the holder check is the settling process's own, ``locks=`` or not): a
  paused ex-holder whose message SQS redelivered still holds its receipt, and its late
  settle counts the child if it comes first (once all the same: the later one counts
  nothing), so the outcome counted is whichever settle came first.
- **Callbacks** (and a flow's next steps) are enqueued, by the completing count, into an
  **outbox** stream in the store (``aqw:{q}:sqs-outbox``) under their idempotency keys
  ``batch:<id>:<kind>``, in that count's step: each is decided exactly once. The worker
  that counted then sends the outbox to SQS and deletes what it sent
  (``sqs_outbox_take.lua``, ``sqs_outbox_done.lua``); a worker killed between the count and
  the send leaves them in the outbox, sent by the next count of any worker, or when a
  broker connects. One killed between a send and its delete sends that job again: a
  callback **message** is then sent at least once (the job, its id and its key, once), and
  a copy received after the first one ended is skipped as completed (its key's completion
  record), as any keyed job on SQS.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from ..._redis import scripts
from ..._redis.client import Redis, ResponseError
from ..._redis.scripts import ms
from ...errors import ConfigError
from ...job import Job
from ...record import UNFINISHED_KEEP
from ..batching import BATCH_HEADER, CALLBACK_KINDS, BatchInfo, BatchSpec
from ..parts import BatchCounts
from ._errors import RecordsUnavailable
from ._keys_redis import DOWN

log = logging.getLogger("aqw.sqs")

#: Outbox entries sent per round; the sender's lock lives this long (ms) per round.
OUTBOX_ROUND = 100
OUTBOX_LOCK_MS = 30_000

Send = Callable[[Sequence[Job]], Awaitable[None]]


class StoreCounts(BatchCounts, Protocol):
    """What the settle steps call of a store's batch counts (Redis's or PostgreSQL's)."""

    async def settled(self, job: Job, state: str, result: str | None, keep_for: float) -> None:
        """Count ``job``'s final state in its batches, before its message is deleted."""

    async def flush(self) -> None:
        """Send the outbox's jobs to SQS."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StoreBatchCounts:
    """The ``BatchCounts`` part of an ``SQSBroker`` with ``records=redis://`` (shared):
    ``client`` gives the store's client, ``send`` publishes jobs to the queue."""

    shared = True

    def __init__(self, queue: str, client: Callable[[], Redis], send: Send) -> None:
        self.queue = queue
        self.prefix = f"aqw:{{{queue}}}:"
        self.outbox = self.prefix + "sqs-outbox"
        self._lock = self.outbox + ":lock"
        self._client, self._send = client, send
        self._open = scripts.load("batch_open")
        self._seal = scripts.load("batch_seal")
        self._add = scripts.load("sqs_batch_add")
        self._drop = scripts.load("sqs_batch_drop")
        self._count = scripts.load("sqs_batch_count")
        self._take = scripts.load("sqs_outbox_take")
        self._done = scripts.load("sqs_outbox_done")

    def key(self, batch_id: str) -> str:
        return f"{self.prefix}batch:{batch_id}"

    async def _call(self, script: scripts.Script, keys: list[str], argv: list[Any]) -> Any:
        try:
            return await script(self._client(), keys, argv)
        except DOWN as exc:
            raise RecordsUnavailable(f"records= store (Redis) unreachable: {exc}") from exc

    async def _run(self, script: scripts.Script, batch_id: str, argv: list[Any]) -> Any:
        try:
            return await self._call(script, [self.key(batch_id)], [self.prefix, batch_id, *argv])
        except ResponseError as exc:
            message = str(exc)
            if "aqw batch" not in message:
                raise
            raise ConfigError(message.partition("aqw ")[2].partition(" script:")[0]) from None

    async def open(self, spec: BatchSpec) -> None:
        argv: list[Any] = [
            "1" if spec.fail_fast else "0",
            ms(spec.keep_for),
            ms(spec.key_ttl),
            spec.parent or "",
            ms(UNFINISHED_KEEP),
            "1" if spec.sealed else "0",
            " ".join(spec.inputs),
            spec.data,
            len(spec.members),
            *spec.members,
        ]
        for kind, job in spec.callbacks.items():  # enqueued into the outbox, then sent
            argv += (kind, job.encode(), job.id, job.task, self.outbox)
            argv += (repr(job.enqueued_at), job.headers.get(BATCH_HEADER, ""))
        await self._run(self._open, spec.id, argv)

    async def add(self, batch_id: str, jobs: list[Job]) -> None:
        """Their membership first, then their send; a failed send takes it back."""
        await self._run(self._add, batch_id, [ms(UNFINISHED_KEEP), *(job.id for job in jobs)])
        if not jobs:
            return
        try:
            await self._send(jobs)
        except BaseException:
            try:
                await self._call(self._drop, [self.key(batch_id)], [job.id for job in jobs])
            except Exception as exc:
                log.error(
                    "sqs://%s: the send of %d children of batch %s failed and their "
                    "membership could not be taken back (%r): the batch cannot complete",
                    self.queue,
                    len(jobs),
                    batch_id,
                    exc,
                )
            raise

    async def seal(self, batch_id: str) -> BatchInfo:
        if not await self._run(self._seal, batch_id, ["0"]):
            raise ConfigError(f"batch {batch_id!r}: no such batch (unknown id, or expired)")
        await self.flush()  # an empty batch completes at its seal
        info = await self.info(batch_id)
        assert info is not None
        return info

    async def cancel(self, batch_id: str) -> BatchInfo | None:
        """Seals the batch; its children are not stopped: their records are in each
        worker's process, out of the store's reach (they run, and count as they end)."""
        if not await self._run(self._seal, batch_id, ["1"]):
            return None
        await self.flush()
        return await self.info(batch_id)

    async def info(self, batch_id: str) -> BatchInfo | None:
        key = self.key(batch_id)
        try:
            async with self._client().pipeline(transaction=False) as pipe:
                pipe.hgetall(key)
                pipe.scard(key + ":todo")
                raw, pending = await pipe.execute()
        except DOWN as exc:
            raise RecordsUnavailable(f"records= store (Redis) unreachable: {exc}") from exc
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        callbacks = {
            kind: fields[f"fired:{kind}"] for kind in CALLBACK_KINDS if f"fired:{kind}" in fields
        }
        return BatchInfo.from_fields(batch_id, fields, int(pending), callbacks)

    async def children(self, batch_id: str, start: int, count: int) -> list[str]:
        if count <= 0:
            return []
        start = max(0, start)
        key = self.key(batch_id) + ":children"
        raw = await self._client().lrange(key, start, start + count - 1)
        return [_text(v) for v in raw]

    # -- the count of the settle steps, and the outbox -----------------------------------

    async def settled(self, job: Job, state: str, result: str | None, keep_for: float) -> None:
        """Count ``job``'s final ``state`` in the batches its ``BATCH_HEADER`` names, once,
        its ``result`` (JSON text) kept ``keep_for`` seconds; then send what the count put
        into the outbox. A store that does not answer raises ``RecordsUnavailable``: the
        settle stops there, its message is not deleted (it comes back, and counts then)."""
        argv = [self.prefix, job.headers[BATCH_HEADER], job.id, state, result or ""]
        left = await self._call(self._count, [self.outbox], [*argv, ms(max(keep_for, 1.0))])
        if int(left):
            await self.flush()

    async def flush(self) -> None:
        """Send the outbox's jobs to SQS, deleting each round once sent (while another
        worker sends it, nothing). A failed send logs and leaves them for the next flush.
        Each flush holds the lock under a token of its own: two flushes of one process (two
        counts at once) must not both send the same entries."""
        keys, token = [self.outbox, self._lock], uuid.uuid4().hex
        try:
            while True:
                entries = await self._call(self._take, keys, [token, OUTBOX_LOCK_MS, OUTBOX_ROUND])
                if not entries:
                    return
                ids = [_text(entry_id) for entry_id, _ in entries]
                jobs = [Job.decode(_fields(fields)["j"]) for _, fields in entries]
                await self._send(jobs)
                left = await self._call(self._done, keys, [token, *ids])
                if not int(left):
                    return
        except Exception as exc:  # the counts are made: the next flush sends what is left
            log.warning("sqs://%s: the batch outbox was not sent now (%r)", self.queue, exc)


def _fields(raw: Any) -> dict[str, bytes | str]:
    """A stream entry's fields (a flat list in a script's reply) as a mapping."""
    if isinstance(raw, dict):
        return {_text(k): v for k, v in raw.items()}
    items = list(raw)
    return {_text(items[i]): items[i + 1] for i in range(0, len(items), 2)}
