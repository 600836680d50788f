"""What the app's features need of the broker's parts (``aqw.brokers.parts``), checked once
at worker start: a feature that needs a part the broker does not have, or has only in this
process, is refused with one line naming the task, the feature, the part and the fix.

- ``keep_result`` needs job records shared across processes (a result is read by the
  producer, elsewhere), or at least their final records (``SharedResults``: SQS with a
  ``records=redis://`` store), which the worker then asks for those tasks;
- periodic tasks (``schedule=``) need schedule marks shared across processes (a new leader
  resumes where the last one stopped);
- ``rate_limit`` and ``max_per_key`` need the start step to enforce them, across every
  worker of the queue; an adaptive ``rate_limit`` (``aqw.Adaptive``) needs limits changed at
  run time (the ``run_limits`` part).

A broker whose whole queue lives in the process (``Broker.in_process``: the memory broker)
is allowed everything it has: its parts are as shared as its queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..brokers.base import Broker
from ..brokers.parts import PART_NAMES, SharedResults
from ..errors import ConfigError
from ..task import Task


def _local(broker: Broker, part: str, needs: str, fix: str) -> ConfigError:
    """The one line refusing what ``needs`` (``"<feature> need(s)"``) of ``part``."""
    where = f"the {broker.system} broker of queue {broker.queue!r}"
    return ConfigError(
        f"{needs} {PART_NAMES[part]} shared across processes, and {where} keeps them in "
        f"this process only: {fix}"
    )


def check_shared_parts(broker: Broker, tasks: Mapping[str, Task[Any]]) -> None:
    """Refuse, at worker start, a task whose feature needs a part ``broker`` does not have
    or keeps in this process only (see the module docstring; ``check_limits`` is checked
    as each queue's job path is made)."""
    if broker.in_process:
        return
    if not broker.records.shared:
        kept = sorted(name for name, task in tasks.items() if task.options.keep_result)
        records = broker.records
        if kept and isinstance(records, SharedResults) and records.results_shared:
            records.keep_results_of(kept)
        elif kept:
            feature = f"task {kept[0]!r}: keep_result needs"
            fix = (
                "keep results on a broker with shared records (redis://, postgresql://, "
                "nats://, or sqs:// with records=redis://), or drop keep_result"
            )
            raise _local(broker, "records", feature, fix)
    if not broker.marks.shared:
        periodic = sorted(name for name, task in tasks.items() if task.options.schedule)
        if periodic:
            feature = f"periodic tasks ({', '.join(periodic)}) need"
            fix = "run them on a broker with shared schedule marks (redis://, postgresql://)"
            raise _local(broker, "marks", feature, fix)


def check_limits(broker: Broker, tasks: Mapping[str, Task[Any]]) -> None:
    """Refuse a task whose rate limit or per-key cap the start step of ``broker`` does not
    enforce, or enforces in this process only (SQS: no shared store for them)."""
    limits = broker.flow_limits
    for name, task in tasks.items():
        for option in task.options.flow.options:
            if limits is None or option not in limits.options:
                raise ConfigError(
                    f"task {name!r}: {option} needs a broker that enforces it across workers "
                    f"(redis://, postgresql:// or memory://); the {type(broker).__name__} broker "
                    "does not"
                )
            if not limits.shared and not broker.in_process:
                needs = f"task {name!r}: {option} needs"
                raise _local(broker, "flow_limits", needs, "use redis:// or postgresql://")
        if task.options.flow.floor is not None and broker.run_limits is None:
            raise ConfigError(
                f"task {name!r}: an adaptive rate_limit (aqw.Adaptive) needs limits changed at "
                f"run time, stored with the queue, and the {broker.system} broker keeps none: "
                "give a fixed rate_limit, or use redis://, postgresql:// or memory://"
            )
