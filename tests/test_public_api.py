"""The public API is what ``aqw/__init__.py`` exports, no more: it cannot grow by accident."""

import aqw

EXPECTED = [
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


def test_all_is_the_documented_list() -> None:
    assert aqw.__all__ == EXPECTED


def test_every_name_is_importable_and_documented() -> None:
    for name in aqw.__all__:
        obj = getattr(aqw, name)
        if name != "__version__":
            assert obj.__doc__, f"aqw.{name} has no docstring"


def test_version_matches_the_package_metadata() -> None:
    from importlib.metadata import version

    assert aqw.__version__ == version("aqw")


def test_py_typed_is_shipped() -> None:
    from importlib import resources

    assert resources.files("aqw").joinpath("py.typed").is_file()
