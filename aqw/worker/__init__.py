"""The runtime: a worker that fetches jobs from a broker and runs each under its lease.

The job's path, file by file: ``_intake`` (fetch with backpressure, promote due jobs,
reclaim abandoned ones), ``_slots`` (at most ``concurrency`` jobs at once, a prefetch
buffer), ``_job_path`` (decode, find the task, validate the payload, take the lease, run),
``_handler`` (the handler under its timeout and lease, and its outcome), ``_settle`` (ack,
retry, dead-letter or give back, each one atomic broker step). ``_worker`` wires them
together and owns the lifecycle and the heartbeat.
"""

from ._running import WorkerStats
from ._worker import Worker

__all__ = ["Worker", "WorkerStats"]
