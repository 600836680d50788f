"""aqw: an asyncio-native job queue worker.

Typed ``async def`` tasks, each job run under a renewed, fenced lease, on Redis Streams,
Amazon SQS or an in-process broker; retries with backoff, a dead-letter queue, and
graceful shutdown.
"""

from .app import App
from .brokers.base import Broker, DeadJob, QueueDepth
from .context import Context
from .dlq import DeadLetters
from .errors import (
    AqwError,
    BrokerUnavailable,
    ConfigError,
    JobTimeout,
    LeaseLost,
    LeaseUnavailable,
    MalformedJob,
    Reject,
    Retry,
    UnknownTask,
)
from .job import Job
from .lease import Lease, LeaseBackend, LeaseKeeper, RedisLeaseBackend
from .retry import RetryPolicy
from .runtime import Worker, WorkerStats
from .task import Enqueued, Task

__version__ = "0.1.0"

__all__ = [
    "App",
    "AqwError",
    "Broker",
    "BrokerUnavailable",
    "ConfigError",
    "Context",
    "DeadJob",
    "DeadLetters",
    "Enqueued",
    "Job",
    "JobTimeout",
    "Lease",
    "LeaseBackend",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseUnavailable",
    "MalformedJob",
    "QueueDepth",
    "RedisLeaseBackend",
    "Reject",
    "Retry",
    "RetryPolicy",
    "Task",
    "UnknownTask",
    "Worker",
    "WorkerStats",
    "__version__",
]
