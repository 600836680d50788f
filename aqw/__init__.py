"""aqw: an asyncio-native job queue worker.

Typed ``async def`` tasks, each job run under a renewed, fenced lease, on Redis Streams,
Amazon SQS or an in-process broker; retries with backoff, a dead-letter queue, and
graceful shutdown.
"""

from ._redis.lease import RedisLeaseBackend
from ._version import __version__
from .app import App, DeadLetters, Jobs
from .brokers.base import Broker, DeadJob, QueueDepth
from .brokers.batching import BatchInfo
from .cache import Cache, CacheEntry
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
from .lease.redlock import RedlockBackend
from .monitor import Alert, CallbackSink, LogSink, Monitor, Sink, WebhookSink
from .record import JobError, JobInfo
from .retry import RetryPolicy
from .schedule import Cron, Every, Schedule
from .task import Enqueued, Task
from .telemetry import Telemetry
from .worker import Worker, WorkerStats
from .workflows import Batch, Flow

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
