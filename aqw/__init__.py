"""aqw: an asyncio-native job queue worker.

Typed ``async def`` tasks, each job run under a renewed, fenced lease, on Redis Streams,
Amazon SQS or an in-process broker; retries with backoff, a dead-letter queue, and
graceful shutdown.
"""

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .app import App, DeadLetters, Jobs
from .brokers.base import Broker, DeadJob, QueueDepth
from .brokers.batching import BatchInfo
from .context import Context
from .errors import (
    AqwError,
    BrokerUnavailable,
    ConfigError,
    HandlerStopped,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobTimeout,
    LeaseLost,
    LeaseUnavailable,
    MalformedJob,
    PayloadTooLarge,
    RateLimited,
    Reject,
    ResultNotKept,
    Retry,
    TooManyDeliveries,
    UnknownJob,
    UnknownTask,
)
from .flow import Adaptive
from .idempotency import SqlCompletionStore
from .job import Job
from .lease import Lease, LeaseBackend, LeaseKeeper
from .monitor import Alert, CallbackSink, LogSink, Monitor, Sink, WebhookSink
from .record import JobError, JobInfo
from .retry import RetryPolicy
from .schedule import Cron, Every, Schedule
from .task import Enqueued, Task
from .telemetry import Telemetry
from .worker import Worker, WorkerStats
from .workflows import Batch, Flow

if TYPE_CHECKING:
    from ._redis.lease import RedisLeaseBackend
    from .cache import Cache, CacheEntry
    from .lease.redlock import RedlockBackend

__all__ = [
    "Adaptive",
    "Alert",
    "App",
    "AqwError",
    "Batch",
    "BatchInfo",
    "Broker",
    "BrokerUnavailable",
    "Cache",
    "CacheEntry",
    "CallbackSink",
    "ConfigError",
    "Context",
    "Cron",
    "DeadJob",
    "DeadLetters",
    "Enqueued",
    "Every",
    "Flow",
    "HandlerStopped",
    "Job",
    "JobCancelled",
    "JobError",
    "JobExpired",
    "JobFailed",
    "JobInfo",
    "JobTimeout",
    "Jobs",
    "Lease",
    "LeaseBackend",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseUnavailable",
    "LogSink",
    "MalformedJob",
    "Monitor",
    "PayloadTooLarge",
    "QueueDepth",
    "RateLimited",
    "RedisLeaseBackend",
    "RedlockBackend",
    "Reject",
    "ResultNotKept",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "Sink",
    "SqlCompletionStore",
    "Task",
    "Telemetry",
    "TooManyDeliveries",
    "UnknownJob",
    "UnknownTask",
    "WebhookSink",
    "Worker",
    "WorkerStats",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """The names whose modules import redis-py, loaded on first use: ``import aqw`` (and an
    app on memory://, SQS, PostgreSQL or NATS) does not pay redis-py's import (about 0.2 s of
    CPU, a third of aqw's start-up)."""
    if name == "RedisLeaseBackend":
        from ._redis.lease import RedisLeaseBackend

        return RedisLeaseBackend
    if name == "RedlockBackend":
        from .lease.redlock import RedlockBackend

        return RedlockBackend
    if name in ("Cache", "CacheEntry"):
        from . import cache

        return getattr(cache, name)
    raise AttributeError(f"module 'aqw' has no attribute {name!r}")
