"""The producer's step: validate payloads, build the jobs and hand them to their queue's broker
(published now, scheduled for later, under an idempotency key, debounced, or written to the
outbox in the caller's transaction, ``conn=``). Each job's
wire form is made and looked at before anything is written (``check_jobs``): valid UTF-8
JSON, no non-finite number, within its task's size cap; one bad job refuses the batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from .._text import error_line, quoted
from ..brokers import Broker
from ..brokers.parts import Debounce
from ..errors import ConfigError, PayloadTooLarge
from ..flow import MAX_KEY, Fairness, check_weight, route_key
from ..job import Job, non_finite_in
from ..outbox import Outbox
from ..task import GROUP_HEADER, Enqueued, Task
from ..telemetry import Telemetry
from ._arguments import check_headers, debounce_headers, enqueue_times, priority_of


class ProducerApp(Protocol):
    """What enqueueing needs of the App."""

    @property
    def queue(self) -> str: ...
    @property
    def idempotency_ttl(self) -> float: ...
    def broker_for(self, queue: str) -> Broker: ...
    def telemetry_for(self, queue: str) -> Telemetry: ...
    @property
    def outbox(self) -> Outbox | None: ...


async def enqueue_jobs(
    app: ProducerApp,
    target: Task[Any],
    payloads: Sequence[Any],
    *,
    key: str | None,
    delay: float | None,
    at: datetime | None,
    headers: dict[str, str] | None,
    expires: float | datetime | None,
    debounce: float | None,
    debounce_max: float | None,
    queue: str | None,
    priority: int | None,
    fairness_key: str | None = None,
    fairness_weight: float | None = None,
    conn: Any = None,
) -> list[Enqueued]:
    """Enqueue one job of ``target`` per payload; every argument is checked and every payload
    validated before anything is written (the options are ``Task.enqueue``'s)."""
    if (
        conn is None
        and len(payloads) == 1
        and key is None
        and delay is None
        and at is None
        and headers is None
        and expires is None
        and debounce is None
        and debounce_max is None
        and priority is None
        and fairness_key is None
        and fairness_weight is None
        and target.options.fairness is None
    ):
        return [await _enqueue_plain(app, target, payloads, queue)]
    queue = queue if queue is not None else target.options.queue or app.queue
    broker = app.broker_for(queue)  # a bad queue name raises before anything is written
    run_at, expires_at = enqueue_times(key, delay, at, expires)
    check_headers(headers)
    level = priority_of(priority, target.options.priority, "enqueue")
    bodies = [target.validate(p) for p in payloads]
    timed = delay is not None or at is not None
    heads = debounce_headers(headers, key, timed, len(bodies), debounce, debounce_max)
    jobs = [
        Job(
            task=target.name,
            payload=b,
            key=key,
            headers=h,
            expires_at=expires_at,
            priority=level,
        )
        for b, h in zip(bodies, target.job_headers(payloads, bodies, heads), strict=True)
    ]
    fair = target.options.fairness
    if fair is not None or fairness_key is not None or fairness_weight is not None:
        jobs = fair_jobs(target, fair, fairness_key, fairness_weight, payloads, bodies, jobs)
        if any(job.fairness_key is not None for job in jobs):
            if conn is not None:
                raise ConfigError(
                    f"task {target.name!r}: a job with a fairness key cannot go through the "
                    "outbox (conn=): its relay publishes to the queue, not to a fair turn"
                )
            return await _enqueue_fair(app, broker, queue, target, jobs, key, run_at)
    if broker.routes_jobs:  # a partitioned queue: each id names the job's partition
        jobs = placed(broker, target, payloads, bodies, jobs)
    with app.telemetry_for(queue).publish(jobs):  # measured with the headers it adds
        check_jobs(target.name, target.options.max_payload_bytes, jobs)
        if conn is not None:  # a row per job in the caller's transaction; the relay publishes
            await outbox_of(app, debounce).write(conn, queue, jobs, run_at)
            return [Enqueued(job.id) for job in jobs]
        if key is not None:
            if len(jobs) != 1:
                raise ConfigError("enqueue: an idempotency key names exactly one job")
            due = run_at if run_at is not None and run_at > time.time() else None
            job_id, duplicate = await (
                debounced(broker).publish(jobs[0], debounce, debounce_max)
                if debounce is not None  # a debounce key, not an idempotency key
                else broker.publish_unique(jobs[0], app.idempotency_ttl, due)
            )
            return [Enqueued(job_id, duplicate)]
        if run_at is not None and run_at > time.time():
            await broker.schedule(jobs, run_at)
        else:
            await broker.publish(jobs)
    return [Enqueued(job.id) for job in jobs]


async def _enqueue_plain(
    app: ProducerApp, target: Task[Any], payloads: Sequence[Any], queue: str | None
) -> Enqueued:
    """``enqueue_jobs`` of one payload with no option but ``queue`` (the common enqueue):
    the same checks in the same order and the same job, without the steps of the options."""
    queue = queue if queue is not None else target.options.queue or app.queue
    broker = app.broker_for(queue)
    bodies = [target.validate(payloads[0])]
    heads = target.job_headers(payloads, bodies, {})
    jobs = [
        Job(task=target.name, payload=bodies[0], headers=heads[0], priority=target.options.priority)
    ]
    if broker.routes_jobs:
        jobs = placed(broker, target, payloads, bodies, jobs)
    with app.telemetry_for(queue).publish(jobs):
        check_jobs(target.name, target.options.max_payload_bytes, jobs)
        await broker.publish(jobs)
    return Enqueued(jobs[0].id)


class QueueOwner(Protocol):
    """What building a batch's jobs needs of the App: its queue."""

    @property
    def queue(self) -> str: ...


def build_jobs(
    app: QueueOwner,
    target: Task[Any],
    payloads: Sequence[Any],
    headers: dict[str, str],
    queue: str,
    key: str | None = None,
) -> list[Job]:
    """Jobs of ``target`` for ``payloads`` on ``queue`` with ``headers`` (a batch's children
    and callbacks), validated and their wire forms checked (``check_jobs``); a task whose
    jobs go to another queue is a ConfigError naming the queues."""
    own = target.options.queue or app.queue
    if own != queue:
        raise ConfigError(
            f"batch: task {target.name!r} sends its jobs to queue {own!r}, and the batch "
            f"lives on queue {queue!r}: a batch's children and callbacks share its queue"
        )
    bodies = [target.validate(p) for p in payloads]
    heads = target.job_headers(payloads, bodies, headers)
    jobs = [
        Job(task=target.name, payload=b, headers=h, key=key, priority=target.options.priority)
        for b, h in zip(bodies, heads, strict=True)
    ]
    check_jobs(target.name, target.options.max_payload_bytes, jobs)
    return jobs


def placed(
    broker: Broker,
    target: Task[Any],
    payloads: Sequence[Any],
    bodies: Sequence[Any],
    jobs: list[Job],
) -> list[Job]:
    """``jobs`` with ids naming their partition: the one of each job's route (its task's
    rate or cap key of the payload, its key, its group), else the next in turn."""
    flow, model = target.options.flow, target.codec.model
    keyed = flow.rate_key is not None or flow.concurrency_key is not None
    out = []
    for p, b, job in zip(payloads, bodies, jobs, strict=True):
        payload = (p if model and isinstance(p, model) else target.codec.load(b)) if keyed else p
        route = route_key(target.name, flow, payload, job.key, job.headers.get(GROUP_HEADER))
        out.append(job.model_copy(update={"id": broker.job_id_for(route)}))
    return out


def fair_jobs(
    target: Task[Any],
    fair: Fairness | None,
    key: str | None,
    weight: float | None,
    payloads: Sequence[Any],
    bodies: Sequence[Any],
    jobs: list[Job],
) -> list[Job]:
    """``jobs`` with their fairness key and weight: the enqueue's, else the task's (its
    functions see the validated payload)."""
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_KEY):
        raise ConfigError(
            f"enqueue: fairness_key must be a string of 1-{MAX_KEY} characters, got {quoted(key)}"
        )
    if weight is not None:
        weight = check_weight(weight, target.name)
    model = target.codec.model
    out = []
    for p, b, job in zip(payloads, bodies, jobs, strict=True):
        k, w = None, 1.0
        if fair is not None and (key is None or weight is None):
            payload = p if model and isinstance(p, model) else target.codec.load(b)
            k, w = fair.of(target.name, payload)
        k = key if key is not None else k
        w = weight if weight is not None else w
        if k is None and weight is not None:
            raise ConfigError("enqueue: fairness_weight needs a fairness_key")
        out.append(
            job if k is None else job.model_copy(update={"fairness_key": k, "fairness_weight": w})
        )
    return out


async def _enqueue_fair(
    app: ProducerApp,
    broker: Broker,
    queue: str,
    target: Task[Any],
    jobs: list[Job],
    key: str | None,
    run_at: float | None,
) -> list[Enqueued]:
    """Enqueue jobs of which some have a fairness key: those into their keys' turns (the
    broker's ``fair_shares``), the others as usual. Refused, in one line, on a broker
    without fair shares, and with an idempotency or debounce key or a delay (a job that
    waits elsewhere first would join the queue outside its key's turn)."""
    part = broker.fair_shares
    if part is None:
        raise ConfigError(
            f"enqueue: fairness_key needs a broker that picks jobs by fair shares; the "
            f"{broker.system} broker does not (use redis:// or memory://; on SQS, group_key "
            "names the MessageGroupId, whose groups a fair queue balances)"
        )
    if key is not None or run_at is not None:
        what = "key=" if key is not None else "delay=/at="
        raise ConfigError(f"enqueue: fairness_key does not go with {what} (not supported yet)")
    with app.telemetry_for(queue).publish(jobs):
        check_jobs(target.name, target.options.max_payload_bytes, jobs)
        fair = [job for job in jobs if job.fairness_key is not None]
        plain = [job for job in jobs if job.fairness_key is None]
        await part.publish(fair)
        if plain:
            await broker.publish(plain)
    return [Enqueued(job.id) for job in jobs]


def outbox_of(app: ProducerApp, debounce: float | None) -> Outbox:
    """The app's outbox for an ``enqueue(..., conn=)``; a ConfigError when it has none."""
    if app.outbox is None:
        raise ConfigError(
            "enqueue conn=: the app has no outbox: aqw.App(broker, outbox='postgresql://...') "
            "names the database the relay reads"
        )
    if debounce is not None:
        raise ConfigError("enqueue conn=: debounce cannot go through the outbox")
    return app.outbox


def debounced(broker: Broker) -> Debounce:
    """The broker's debounce part; a ConfigError naming ``debounce`` when it has none, or
    only one kept in this process (a producer elsewhere would not see the waiting job)."""
    part = broker.debounce
    if part is None:
        raise ConfigError(
            f"enqueue: debounce needs a broker that can replace a waiting job; the "
            f"{type(broker).__name__} broker cannot (a sent message cannot be replaced)"
        )
    if not part.shared and not broker.in_process:
        raise ConfigError(
            f"enqueue: debounce needs debounced jobs shared across processes, and the "
            f"{broker.system} broker keeps them in this process only: use redis:// or "
            "postgresql://"
        )
    return part


def check_jobs(task: str, limit: int | None, jobs: Sequence[Job]) -> None:
    """Encode every job (the wire form is kept: the broker sends that one) and refuse the
    whole batch, with one line naming the task (and the payload, in a batch), when one
    cannot be written as JSON, holds a nan or an infinity, or is over ``limit`` bytes."""
    for i, job in enumerate(jobs):
        try:
            wire = job.encode()
        except Exception as exc:  # a lone surrogate in a string, for one
            raise ConfigError(
                f"task {task!r}: the payload{_where(i, jobs)} cannot be written as JSON: "
                f"{error_line(exc)}"
            ) from None
        if b"NaN" in wire or b"Infinity" in wire:  # or a string's text: then looked at
            bad = non_finite_in(wire, job.payload)
            if bad is not None:
                field, number = bad
                what = f"payload field {quoted(field)}" if field else "the payload"
                raise ConfigError(
                    f"task {task!r}: {what}{_where(i, jobs)} is {number!r}: JSON has no "
                    "non-finite numbers"
                )
        if limit is not None and len(wire) > limit:
            raise PayloadTooLarge(task, len(wire), limit, where=_where(i, jobs))


def _where(i: int, jobs: Sequence[Job]) -> str:
    """`` (payload 2 of 3)`` in a batch, else nothing."""
    return f" (payload {i + 1} of {len(jobs)})" if len(jobs) > 1 else ""
