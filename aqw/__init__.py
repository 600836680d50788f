"""aqw: an asyncio-native job queue worker.

Typed ``async def`` tasks, each job run under a renewed, fenced lease, on Redis Streams,
Amazon SQS or an in-process broker; retries with backoff, a dead-letter queue, and
graceful shutdown.
"""

from ._redis.lease import RedisLeaseBackend
from ._version import __version__
from .app import App
from .brokers.base import Broker, DeadJob, QueueDepth
from .cache import Cache, CacheEntry
from .context import Context
from .dlq import DeadLetters
from .errors import (
    AqwError,
    BrokerUnavailable,
    ConfigError,
    HandlerStopped,
    JobTimeout,
    LeaseLost,
    LeaseUnavailable,
    MalformedJob,
    PayloadTooLarge,
    Reject,
    Retry,
    TooManyDeliveries,
    UnknownTask,
)
from .idempotency import SqlCompletionStore
from .job import Job
from .lease import Lease, LeaseBackend, LeaseKeeper
from .monitor import Alert, CallbackSink, LogSink, Monitor, Sink, WebhookSink
from .redlock import RedlockBackend
from .retry import RetryPolicy
from .task import Enqueued, Task
from .telemetry import Telemetry
from .worker import Worker, WorkerStats

__all__ = [
    "Alert",
    "App",
    "AqwError",
    "Broker",
    "BrokerUnavailable",
    "Cache",
    "CacheEntry",
    "CallbackSink",
    "ConfigError",
    "Context",
    "DeadJob",
    "DeadLetters",
    "Enqueued",
    "HandlerStopped",
    "Job",
    "JobTimeout",
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
    "RedisLeaseBackend",
    "RedlockBackend",
    "Reject",
    "Retry",
    "RetryPolicy",
    "Sink",
    "SqlCompletionStore",
    "Task",
    "Telemetry",
    "TooManyDeliveries",
    "UnknownTask",
    "WebhookSink",
    "Worker",
    "WorkerStats",
    "__version__",
]
