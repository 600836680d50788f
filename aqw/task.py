"""Tasks: an ``async def`` handler, its payload type taken from its signature, and options."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from ._codecs import PayloadCodec, ResultCodec
from ._text import error_line
from .context import Context
from .errors import ConfigError
from .flow import NO_FLOW, Fairness, FlowControl
from .record import DEFAULT_KEEP_FOR
from .retry import RetryPolicy
from .schedule import Schedule

R = TypeVar("R")
Handler = Callable[..., Awaitable[R]]


class TaskApp(Protocol):
    """What a task needs of the App it is registered on: a way to enqueue."""

    async def enqueue(
        self,
        task: Task[Any],
        payloads: Sequence[Any],
        *,
        key: str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        headers: dict[str, str] | None = None,
        expires: float | datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        debounce: float | None = None,
        debounce_max: float | None = None,
        fairness_key: str | None = None,
        fairness_weight: float | None = None,
        conn: Any = None,
    ) -> list[Enqueued]: ...


class Enqueued(str):
    """The id of an enqueued job. ``duplicate`` is True when an idempotency key matched a job
    enqueued before, in which case no new job was written and this is the earlier job's id."""

    duplicate: bool = False

    def __new__(cls, job_id: str, duplicate: bool = False) -> Enqueued:
        self = super().__new__(cls, job_id)
        self.duplicate = duplicate
        return self


#: Cache keys a task invalidates when a job completes: templates formatted with the payload's
#: fields, or a function of the payload.
Invalidates = Sequence[str] | Callable[[Any], Iterable[str]]


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """Per-task settings, resolved against the app's defaults at registration."""

    retry: RetryPolicy
    lease_ttl: float
    timeout: float | None
    sla: float | None
    max_deliveries: int
    invalidates: Invalidates | None = None
    #: Most bytes of an encoded job (``Job.encode()``), checked at enqueue and on receipt;
    #: None: no cap. Resolved at registration (the app's unless the task sets its own).
    max_payload_bytes: int | None = None
    #: Keep the handler's return value in the job's record (``app.result``).
    keep_result: bool = False
    #: Seconds a finished job's record (and its result) lives.
    keep_for: float = DEFAULT_KEEP_FOR
    #: Most bytes of a kept result as JSON; a bigger one is not kept (the record says why).
    max_result_bytes: int | None = 1_048_576
    #: Dead-letter a job that fails for good (False: it ends ``failed``, kept in its record
    #: only).
    dead_letter: bool = True
    #: A periodic task's schedule (``aqw.Cron``, ``aqw.Every``): the workers' scheduler
    #: enqueues one job per tick. None: enqueued by callers only.
    schedule: Schedule | None = None
    #: The priority level of this task's jobs unless an enqueue names one: 0-9, higher
    #: runs first.
    priority: int = 0
    #: Rate limit and per-key concurrency cap (``@app.task(rate_limit=..., ...)``).
    flow: FlowControl = NO_FLOW
    #: The queue this task's jobs go to unless an enqueue names one (None: the app's).
    queue: str | None = None
    #: A function of the validated payload: the job's message group (``GROUP_HEADER``).
    group_key: Callable[[Any], object] | None = None
    #: Fair shares between keys (``@app.task(fairness_key=..., fairness_weight=...)``).
    fairness: Fairness | None = None

    def keys_to_invalidate(self, payload: Any) -> list[str]:
        """The cache keys a completed job with ``payload`` invalidates."""
        if self.invalidates is None:
            return []
        if callable(self.invalidates):
            return list(self.invalidates(payload))
        if isinstance(payload, BaseModel):
            fields = payload.model_dump()
        elif isinstance(payload, dict):
            fields = payload
        else:
            fields = {"payload": payload}
        return [template.format(**fields) for template in self.invalidates]


class Task(Generic[R]):
    """A registered handler. Call ``enqueue`` to run it on a worker."""

    def __init__(self, app: TaskApp, fn: Handler[R], name: str, options: TaskOptions) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"task {name!r}: the handler must be an `async def` function")
        self.app = app
        self.fn = fn
        self.name = name
        self.options = options
        self.codec = PayloadCodec(fn, Context)
        if options.schedule is not None and self.codec.required:
            raise ConfigError(
                f"task {name!r}: schedule: a periodic job is enqueued with no payload, so the "
                f"handler's payload parameters need defaults ({', '.join(self.codec.required)}"
                " has none)"
            )
        self.results = ResultCodec(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    async def __call__(self, *args: Any, **kwargs: Any) -> R:
        """Run the handler directly, in this process (no queue, no lease)."""
        return await self.fn(*args, **kwargs)

    def validate(self, payload: Any) -> Any:
        """The payload's JSON-able form; raises ``pydantic.ValidationError`` when invalid,
        and a ``ConfigError`` naming the task when it cannot be made JSON (an arbitrary
        object, bytes that are not UTF-8, a list that contains itself)."""
        try:
            return self.codec.dump(payload)
        except ValidationError:
            raise
        except ConfigError as exc:
            raise ConfigError(f"task {self.name!r}: {exc}") from None
        except Exception as exc:  # pydantic's serialisation errors, a codec's, a cycle's
            raise ConfigError(
                f"task {self.name!r}: the payload cannot be written as JSON: {error_line(exc)}"
            ) from None

    def job_headers(
        self, payloads: Sequence[Any], bodies: Sequence[Any], headers: dict[str, str]
    ) -> list[dict[str, str]]:
        """Each job's headers: ``headers``, plus the message group of the task's
        ``group_key`` unless ``headers`` names one; a bad group is a ConfigError naming
        where it came from. ``bodies`` are the validated forms of ``payloads``."""
        given = headers.get(GROUP_HEADER)
        if given is not None:
            check_group(given, f"enqueue: headers[{GROUP_HEADER!r}]")
        if given is not None or self.options.group_key is None:
            return [headers] * len(bodies)
        group_key, model = self.options.group_key, self.codec.model
        what = f"task {self.name!r}: group_key"
        return [
            {
                **headers,
                GROUP_HEADER: check_group(
                    group_key(p if model and isinstance(p, model) else self.codec.load(b)), what
                ),
            }
            for p, b in zip(payloads, bodies, strict=True)
        ]

    async def enqueue(
        self,
        payload: Any = None,
        *,
        key: str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        headers: dict[str, str] | None = None,
        expires: float | datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        debounce: float | None = None,
        debounce_max: float | None = None,
        fairness_key: str | None = None,
        fairness_weight: float | None = None,
        conn: Any = None,
    ) -> Enqueued:
        """Enqueue one job and return its id.

        Args:
            payload: the handler's payload; validated here, so a bad payload raises
                ``pydantic.ValidationError`` before anything is written.
            key: an idempotency key; while its record lives, enqueueing the same key again
                writes nothing and returns the first job's id with ``duplicate=True``.
            delay: run no sooner than this many seconds from now.
            at: run no sooner than this time (timezone-aware, or naive UTC).
            headers: extra string metadata carried with the job.
            expires: seconds from now, or a time, after which the job must not start: it
                then ends ``expired`` without running.
            priority: the job's level, an integer 0-9 (default: the task's, 0 unless set):
                a waiting job of a higher level is handed out before any of a lower one.
            queue: the queue to put it on (default: the task's ``queue``, else the app's).
            debounce: seconds (needs ``key``, no ``delay``/``at``): a burst of enqueues of
                one key runs once, with the last payload, this long after the burst goes
                quiet. While the key's job waits, an enqueue replaces its payload and
                headers, pushes its start back and returns its id with ``duplicate=True``;
                once it has started, an enqueue makes a new job. The key is no idempotency
                key: a finished job does not block the next burst.
            debounce_max: seconds: a burst's job starts no later than this long after its
                first enqueue, however long the burst goes on (>= ``debounce``).
            fairness_key: the key whose fair share the job counts in (over the task's
                ``fairness_key``); ``fairness_weight``: its weight (default: the task's, 1).
            conn: a PostgreSQL connection (asyncpg, psycopg 3 ``AsyncConnection``, or SQLAlchemy
                ``AsyncConnection``/``AsyncSession``) with a
                transaction open: the job is written to the app's outbox in that
                transaction and relayed once it commits (never, if it rolls back). The
                returned id is the job's; ``duplicate`` is always False (a key that matches
                an earlier job is found by the relay, which then writes nothing).
        """
        return (
            await self.app.enqueue(
                self,
                [payload],
                key=key,
                delay=delay,
                at=at,
                headers=headers,
                expires=expires,
                priority=priority,
                queue=queue,
                debounce=debounce,
                debounce_max=debounce_max,
                fairness_key=fairness_key,
                fairness_weight=fairness_weight,
                conn=conn,
            )
        )[0]

    async def enqueue_many(
        self,
        payloads: Sequence[Any],
        *,
        delay: float | None = None,
        at: datetime | None = None,
        expires: float | datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        fairness_key: str | None = None,
        fairness_weight: float | None = None,
        conn: Any = None,
    ) -> list[Enqueued]:
        """Enqueue many jobs in one round trip; every payload is validated first. All of
        them take ``priority`` (default: the task's) and go to ``queue`` (default: the
        task's, else the app's), and ``fairness_key``/``fairness_weight`` when given; with
        ``conn``, as rows of the outbox in its transaction."""
        return await self.app.enqueue(
            self,
            list(payloads),
            delay=delay,
            at=at,
            expires=expires,
            priority=priority,
            queue=queue,
            fairness_key=fairness_key,
            fairness_weight=fairness_weight,
            conn=conn,
        )


#: The job header that holds its message group: SQS's ``MessageGroupId``.
GROUP_HEADER = "aqw-group"
#: A message group as SQS takes it: 1-128 ASCII letters, digits and punctuation.
_GROUP = re.compile(r"[!-~]{1,128}")


def check_group(value: object, what: str) -> str:
    """``value`` when it is a valid message group, else a ConfigError naming ``what``."""
    if not isinstance(value, str) or not _GROUP.fullmatch(value):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ConfigError(
            f"{what} must be a string of 1-128 ASCII letters, digits and punctuation (an SQS "
            f"MessageGroupId), got {shown} ({type(value).__name__})"
        )
    return value


def is_validation_error(exc: BaseException) -> bool:
    return isinstance(exc, ValidationError)
