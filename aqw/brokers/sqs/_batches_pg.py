"""Batches on SQS counted in a ``records=postgresql://`` store (``PostgresBatchCounts``): the
same steps as the Redis store's (``aqw.brokers.sqs._batches``), each one PostgreSQL
transaction, the statements in ``sql/`` and the tables in the versioned migration
``sql/0001_batches.sql`` (beside the keys' table: ``<table>_batches``, ``_batch_members``,
``_batch_callbacks``, ``_outbox``; recorded in ``<table>_migrations``).

- **Adding**: the children's member rows (``ON CONFLICT DO NOTHING``: a member known ahead
  is not added twice) and the batch's total, in one transaction that locks the batch's row
  and checks it is open; then their send to SQS; a failed send deletes the rows again.
- **Counting** (the lease holder's settle, before SQS's delete): in one transaction, per
  batch the child counts in, its member row's ``counted`` flips (``UPDATE ... WHERE NOT
  counted``: a child received again counts nothing), the batch's count moves, and the count
  that leaves a sealed batch with no uncounted member completes it: each callback's
  idempotency key ``batch:<id>:<kind>`` taken in the keys' table and its job inserted into
  the outbox, and the batch counted as ``batch:<id>`` in its parent, all in that
  transaction. A crash anywhere before the commit leaves nothing counted; the message comes
  back and counts then.
- **The outbox** is sent by the worker that counted (or the next count, or a worker's start):
  its rows are taken ``FOR UPDATE SKIP LOCKED`` in a transaction held over the send and
  deleted before its commit. A worker killed after the send and before the commit sends
  them again (same job ids and keys): a callback message at least once, its job once.

Not here: flows with edges (their steps' inputs are their parents' results, and this store
keeps no job records: refused when the flow starts, in one line) and ``fail_fast`` /
``cancel_batch`` stopping children (as with Redis on SQS, they only seal the batch).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from ...errors import ConfigError
from ...job import Job
from ...record import UNFINISHED_KEEP
from ..batching import (
    BATCH_HEADER,
    BATCH_INFO_HEADER,
    CALLBACK_KINDS,
    BatchInfo,
    BatchSpec,
    counted_as,
)
from ._batches import OUTBOX_ROUND, Send
from ._keys_pg import PostgresKeyStore, quote_name

log = logging.getLogger("aqw.sqs")

#: The migrations of these tables, in order (``sql/NNNN_*.sql``).
MIGRATIONS = ((1, "0001_batches"),)


@cache
def _source(name: str) -> str:
    return resources.files("aqw.brokers.sqs").joinpath("sql", f"{name}.sql").read_text("utf-8")


class PostgresBatchCounts:
    """The ``BatchCounts`` part of an ``SQSBroker`` with ``records=postgresql://`` (shared)."""

    shared = True

    def __init__(self, queue: str, store: PostgresKeyStore, send: Send) -> None:
        self.queue = queue
        self._store, self._send = store, send
        base = store.table
        names = {
            "batches": quote_name(base + "_batches"),
            "members": quote_name(base + "_batch_members"),
            "callbacks": quote_name(base + "_batch_callbacks"),
            "outbox": quote_name(base + "_outbox"),
            "keys": quote_name(base),
            "members_pos": quote_name(base.rpartition(".")[2][:40] + "_members_pos_idx"),
            "outbox_queue": quote_name(base.rpartition(".")[2][:40] + "_outbox_queue_idx"),
        }
        self._names = names
        self._versions = quote_name(base + "_migrations")
        self._ready = False

    def _sql(self, name: str) -> str:
        text = _source(name)
        for key, value in self._names.items():
            text = text.replace("{" + key + "}", value)
        return text

    async def _pool(self) -> Any:
        pool = await self._store.pool()
        if not self._ready:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext($1))", f"aqw:{self._versions}"
                )
                await conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._versions} (version integer PRIMARY KEY,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                done = {r[0] for r in await conn.fetch(f"SELECT version FROM {self._versions}")}
                for version, name in MIGRATIONS:
                    if version not in done:
                        await conn.execute(self._sql(name))
                        await conn.execute(
                            f"INSERT INTO {self._versions} (version) VALUES ($1)", version
                        )
            self._ready = True
        return pool

    async def _in_transaction(self, step: Callable[[Any], Any]) -> Any:
        async def run(_: Any) -> Any:
            pool = await self._pool()
            async with pool.acquire() as conn, conn.transaction():
                return await step(conn)

        return await self._store.run(run)

    # -- the producer's steps ----------------------------------------------------------------

    async def open(self, spec: BatchSpec) -> None:
        if spec.inputs or _has_edges(spec.data):  # refused at the flow's own batch: nothing written
            raise ConfigError(
                f"flow: a step after others takes its parents' results, and the "
                f"records=postgresql:// store of sqs://{self.queue} keeps no job records: "
                "run flows with edges on SQS with records=redis://"
            )
        q = self.queue

        async def step(conn: Any) -> None:
            if spec.parent is not None:
                state = await conn.fetchval(self._sql("batch_state"), q, spec.parent)
                if state != "open":
                    raise ConfigError(
                        f"batch {spec.parent} is {state or 'unknown'}: no child can be added to it"
                    )
                await conn.fetchval(
                    self._sql("batch_members_add"), q, spec.parent, [f"batch:{spec.id}"]
                )
            created = await conn.fetchval(
                self._sql("batch_open"),
                q,
                spec.id,
                "sealed" if spec.sealed else "open",
                spec.fail_fast,
                float(spec.keep_for),
                float(spec.key_ttl),
                spec.parent,
                spec.data,
                float(UNFINISHED_KEEP),
            )
            if created is None:
                raise ConfigError(f"batch {spec.id} exists already")
            if spec.members:
                await conn.fetchval(self._sql("batch_members_add"), q, spec.id, list(spec.members))
            for kind, job in spec.callbacks.items():
                await conn.execute(
                    self._sql("batch_callback_put"), q, spec.id, kind, job.encode().decode(), job.id
                )

        await self._in_transaction(step)

    async def add(self, batch_id: str, jobs: list[Job]) -> None:
        """Their membership first, then their send; a failed send takes it back."""
        ids = [job.id for job in jobs]

        async def step(conn: Any) -> None:
            state = await conn.fetchval(self._sql("batch_state"), self.queue, batch_id)
            if state != "open":
                raise ConfigError(
                    f"batch {batch_id} is {state or 'unknown'}: no child can be added to it"
                )
            await conn.fetchval(self._sql("batch_members_add"), self.queue, batch_id, ids)

        await self._in_transaction(step)
        if not jobs:
            return
        try:
            await self._send(jobs)
        except BaseException:
            try:
                await self._in_transaction(
                    lambda c: c.execute(self._sql("batch_members_drop"), self.queue, batch_id, ids)
                )
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

    async def _seal(self, batch_id: str) -> bool:
        async def step(conn: Any) -> bool:
            await conn.execute(self._sql("batch_seal"), self.queue, batch_id)
            row = await conn.fetchrow(self._sql("batch_done"), self.queue, batch_id)
            if row is None:
                return False
            if row["state"] == "sealed" and row["done"]:
                await self._fire(conn, batch_id)
            return True

        return bool(await self._in_transaction(step))

    async def seal(self, batch_id: str) -> BatchInfo:
        if not await self._seal(batch_id):
            raise ConfigError(f"batch {batch_id!r}: no such batch (unknown id, or expired)")
        await self.flush()  # an empty batch completes at its seal
        info = await self.info(batch_id)
        assert info is not None
        return info

    async def cancel(self, batch_id: str) -> BatchInfo | None:
        """Seals the batch; its children are not stopped (their records are in each
        worker's process): they run, and count as they end."""
        if not await self._seal(batch_id):
            return None
        await self.flush()
        return await self.info(batch_id)

    async def info(self, batch_id: str) -> BatchInfo | None:
        row = await self._store.run(
            lambda _: self._fetchrow(self._sql("batch_info"), self.queue, batch_id)
        )
        if row is None:
            return None
        fields = {
            "state": row["state"],
            **{k: str(row[k]) for k in ("total", "succeeded", "failed", "cancelled", "expired")},
            "fail_fast": "1" if row["fail_fast"] else "0",
            "parent": row["parent"] or "",
            "data": row["data"],
            "created_at": repr(row["created_at"]),
            "completed_at": "" if row["completed_at"] is None else repr(row["completed_at"]),
        }
        callbacks = dict(entry.split(" ", 1) for entry in row["fired"])
        return BatchInfo.from_fields(batch_id, fields, int(row["pending"]), callbacks)

    async def _fetchrow(self, sql: str, *args: Any) -> Any:
        pool = await self._pool()
        return await pool.fetchrow(sql, *args)

    async def children(self, batch_id: str, start: int, count: int) -> list[str]:
        if count <= 0:
            return []
        sql, q, first = self._sql("batch_children"), self.queue, max(0, start)

        async def fetch(_: Any) -> list[str]:
            pool = await self._pool()
            return [r[0] for r in await pool.fetch(sql, q, batch_id, first, count)]

        return list(await self._store.run(fetch))

    # -- the count of the settle steps, and the outbox --------------------------------------

    async def settled(self, job: Job, state: str, result: str | None, keep_for: float) -> None:
        """Count ``job``'s final ``state`` once in each batch its ``BATCH_HEADER`` names, in
        one transaction; then send what the count put into the outbox. Unreachable:
        ``RecordsUnavailable`` (the message is not deleted: it comes back, and counts then)."""
        batches = job.headers[BATCH_HEADER].split()

        async def step(conn: Any) -> bool:
            fired = False
            for batch_id in batches:
                fired = await self._count(conn, batch_id, job.id, state) or fired
            return fired

        if await self._in_transaction(step):
            await self.flush()

    async def _count(self, conn: Any, batch_id: str, member: str, state: str) -> bool:
        """Count ``member`` in ``batch_id`` once; True when that completed the batch."""
        if (
            await conn.fetchval(self._sql("batch_member_count"), self.queue, batch_id, member)
            is None
        ):
            return False  # not a member, or counted already
        row = await conn.fetchrow(self._sql("batch_bump"), self.queue, batch_id, counted_as(state))
        if row is None or row["state"] != "sealed" or not row["done"]:
            return False
        await self._fire(conn, batch_id)
        return True

    async def _fire(self, conn: Any, batch_id: str) -> None:
        """Complete the batch (once), enqueue its due callbacks into the outbox under their
        keys, and count it in its parent; all in the caller's transaction."""
        q = self.queue
        row = await conn.fetchrow(self._sql("batch_complete"), q, batch_id)
        if row is None:
            return  # complete already
        total, ok, failed = row["total"], row["succeeded"], row["failed"]
        due = [
            kind
            for kind in CALLBACK_KINDS
            if kind == "complete"
            or (kind == "success" and ok == total)
            or (kind == "failure" and failed > 0)
        ]
        stored = {r["kind"]: r for r in await conn.fetch(self._sql("batch_callbacks"), q, batch_id)}
        ids = {kind: stored[kind]["job_id"] for kind in due if kind in stored}
        info = BatchInfo(
            id=batch_id,
            state="complete",
            total=total,
            pending=0,
            succeeded=ok,
            failed=failed,
            cancelled=row["cancelled"],
            expired=row["expired"],
            callbacks=ids,
            created_at=row["created_at"],
            completed_at=row["completed_at"],
        )
        for kind in ids:
            callback = stored[kind]
            if callback["fired"]:
                continue
            key = f"batch:{batch_id}:{kind}"
            ttl = float(row["key_ttl_s"])
            if await conn.fetchval(self._sql("batch_key_take"), q, key, callback["job_id"], ttl):
                job = Job.decode(callback["job"])
                headers = {**job.headers, BATCH_INFO_HEADER: info.to_json()}
                wire = job.model_copy(update={"headers": headers}).encode().decode()
                await conn.execute(self._sql("batch_fired"), q, batch_id, kind, wire)
        parent = row["parent"]
        if parent:
            outcome = (
                "failed"
                if failed
                else "cancelled"
                if row["cancelled"]
                else "expired"
                if row["expired"]
                else "succeeded"
            )
            await self._count(conn, parent, f"batch:{batch_id}", outcome)

    async def flush(self) -> None:
        """Send the outbox's jobs to SQS, each round's rows locked (``SKIP LOCKED``: another
        worker's send takes others) and deleted in the transaction held over the send. A
        failed send logs and leaves them for the next flush."""
        q = self.queue

        async def round_(conn: Any) -> int:
            rows = await conn.fetch(self._sql("outbox_take"), q, OUTBOX_ROUND)
            if not rows:
                return 0
            await self._send([Job.decode(r["job"]) for r in rows])
            await conn.execute(self._sql("outbox_done"), [r["seq"] for r in rows])
            return len(rows)

        try:
            while await self._in_transaction(round_) == OUTBOX_ROUND:
                pass
        except Exception as exc:  # the counts are made: the next flush sends what is left
            log.warning("sqs://%s: the batch outbox was not sent now (%r)", self.queue, exc)


def _has_edges(data: str) -> bool:
    """True when ``data`` is a flow's (``aqw.workflows``) with a step after others."""
    if not data:
        return False
    try:
        steps = json.loads(data)
    except ValueError:
        return False
    return isinstance(steps, dict) and any(
        isinstance(step, dict) and step.get("after") for step in steps.values()
    )
