"""The App (``App``): tasks, brokers, enqueue, workers; and its operators' APIs, reached
through it: ``app.jobs`` (``Jobs``: a job's record, result, cancel) and ``app.dlq``
(``DeadLetters``: list, show, replay, purge); ``TaskSettings``, the options of
``app.task``. The App's helpers (argument checks,
registration, producing, per-queue telemetry) are this package's private modules."""

from ._app import App
from ._dlq import DeadLetters, dead_job_json
from ._jobs import Jobs
from ._registration import TaskSettings

__all__ = ["App", "DeadLetters", "Jobs", "TaskSettings", "dead_job_json"]
