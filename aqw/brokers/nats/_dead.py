"""The dead-letter stream of a queue (``AQW_q_DLQ``): one message per dead job, its body a
JSON line of the failure then the job's bytes as they were; the entry id is the message's
stream sequence. Listed oldest first, read by id, replayed (published back to the queue
under ``Nats-Msg-Id`` ``replay.<seq>``, so a replay repeated after a crash is dropped as a
duplicate, then deleted) and deleted."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import APIError

from ...job import Job
from ..messages import DeadJob, Failure
from ._layout import Layout


def encode(data: bytes, job: Job | None, failure: Failure, attempts: int) -> bytes:
    head = {
        "task": job.task if job else "",
        "job_id": job.id if job else "",
        "error_type": failure.error_type,
        "error": failure.error,
        "traceback": failure.traceback,
        "attempts": attempts,
        "first_failed_at": failure.first_failed_at or failure.failed_at,
        "last_failed_at": failure.failed_at,
        "worker": failure.worker,
    }
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + data


def decode(entry_id: str, body: bytes) -> DeadJob:
    line, _, data = body.partition(b"\n")
    damaged: list[str] = []
    try:
        head: dict[str, Any] = json.loads(line)
    except ValueError:
        head, damaged = {}, ["failure"]

    def text(name: str) -> str:
        value = head.get(name, "")
        return value if isinstance(value, str) else str(value)

    def number(name: str) -> float:
        value = head.get(name, 0)
        return float(value) if isinstance(value, int | float) else 0.0

    return DeadJob(
        id=entry_id,
        data=data,
        task=text("task"),
        error_type=text("error_type"),
        error=text("error"),
        traceback=text("traceback"),
        attempts=int(number("attempts")),
        first_failed_at=number("first_failed_at"),
        last_failed_at=number("last_failed_at"),
        worker=text("worker"),
        job_id=text("job_id"),
        damaged=tuple(damaged),
    )


class DeadLetters:
    """The DLQ stream's reads and writes."""

    def __init__(self, js: JetStreamContext, names: Layout) -> None:
        self._js = js
        self._names = names

    async def add(self, body: bytes, msg_id: str) -> str:
        ack = await self._js.publish(
            self._names.dlq_subject,
            body,
            stream=self._names.dlq_stream,
            headers={"Nats-Msg-Id": msg_id},
        )
        return str(ack.seq)

    async def count(self) -> int:
        info = await self._js.stream_info(self._names.dlq_stream)
        return int(info.state.messages)

    async def get(self, entry_id: str) -> DeadJob | None:
        seq = _seq(entry_id)
        if seq is None:
            return None
        try:
            msg = await self._js.get_msg(self._names.dlq_stream, seq)
        except APIError as exc:
            if not missing(exc):
                raise
            return None
        return decode(entry_id, msg.data or b"")

    async def entries(self, count: int, after: str | None) -> list[DeadJob]:
        seq = 1 if after is None else (_seq(after) or 0) + 1
        out: list[DeadJob] = []
        while len(out) < count:
            try:
                msg = await self._js.get_msg(
                    self._names.dlq_stream, seq, subject=self._names.dlq_subject, next=True
                )
            except APIError as exc:
                if not missing(exc):
                    raise
                break
            if msg.seq is None:
                break
            out.append(decode(str(msg.seq), msg.data or b""))
            seq = msg.seq + 1
        return out

    async def delete(self, entry_ids: Sequence[str]) -> int:
        n = 0
        for entry_id in entry_ids:
            seq = _seq(entry_id)
            if seq is None:
                continue
            try:
                n += bool(await self._js.delete_msg(self._names.dlq_stream, seq))
            except APIError as exc:
                if not missing(exc):
                    raise
        return n

    async def replay(self, entries: Sequence[tuple[str, Job]]) -> list[Job]:
        """Each entry that still exists published back to the queue, then deleted; the jobs
        replayed."""
        done: list[Job] = []
        for entry_id, job in entries:
            seq = _seq(entry_id)
            if seq is None or await self.get(entry_id) is None:
                continue
            await self._js.publish(
                self._names.subject_for(job.priority),
                job.encode(),
                stream=self._names.stream,
                headers={"Nats-Msg-Id": f"replay.{seq}"},
            )
            if await self.delete([entry_id]):
                done.append(job)
        return done


#: The error codes of a stream message that is not there (2.9 answers 10037 or 10057).
NO_MESSAGE = (10037, 10057)


def missing(exc: APIError) -> bool:
    return exc.code == 404 or exc.err_code in NO_MESSAGE


def _seq(entry_id: str) -> int | None:
    return int(entry_id) if entry_id.isdigit() and int(entry_id) > 0 else None
