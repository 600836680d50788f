"""The parts a broker hands out besides its transport (``aqw.brokers.base.Broker``): small
contracts, each one concern, each found as an attribute of the broker (a lookup, never a
call through the broker).

====================  ==============================  =========================================
attribute             part                            what needs it
====================  ==============================  =========================================
``broker.records``    ``JobRecords``                  ``app.job``, results, ``app.cancel``, waits
``broker.status``     ``WorkerStatus``                ``aqw status``, the monitor, the dashboard
``broker.marks``      ``ScheduleMarks``               periodic tasks (cron)
``broker.history``    ``DepthHistory`` or None        the dashboard's depth chart, delayed page
``broker.debounce``   ``Debounce`` or None            ``enqueue(..., debounce=s)``
``broker.flow_limits`` ``FlowLimits`` or None         rate limits, per-key caps (start step)
``broker.server``     ``ServerInfo`` or None          the dashboard's health box, ``aqw bench``
``broker.batches``    ``BatchCounts`` or None         ``app.batch``: a batch's counts, callbacks
``broker.control``    ``QueueControl`` or None        pause, the waiting list, delete, promote
``broker.rates``      ``JobRates`` or None            the dashboard's rates and per-task durations
``broker.fair_shares`` ``FairShares`` or None         ``fairness_key`` (a class attribute: None
                                                      unless the broker picks by fair shares)
``broker.progress``   ``ProgressStream`` or None      ``app.progress(job_id)`` (a class attribute)
``broker.run_limits`` ``RunLimits`` or None           ``aqw limits``, ``app.limits`` (a class
                                                      attribute: None unless stored with the queue)
====================  ==============================  =========================================

Every part says whether it is ``shared``: True when every process that opens the queue sees
the same state (a server holds it), False when it lives in this process only. A worker
refuses, at its start, a feature that needs a shared part the broker keeps in-process only
(``aqw.worker`` names the part and the fix), unless the whole queue lives in the process
(``Broker.in_process``: the memory broker). A composite broker hands out the part of the
broker that holds it (partition 0's status, the home queue's marks), never a copy.

The in-process implementations of every part are in ``aqw.brokers.local``; a broker
written outside aqw may use them (and says ``shared = False`` by using them).
"""

from __future__ import annotations

from ._flow import Debounce, FairShares, FlowLimits, RunLimits, StartLimits
from ._operate import BatchCounts, JobRates, ProgressStream, QueueControl
from ._part import Part
from ._state import (
    DepthHistory,
    JobRecords,
    ScheduleMarks,
    ServerInfo,
    SharedResults,
    WorkerStatus,
)

__all__ = [
    "PART_NAMES",
    "BatchCounts",
    "Debounce",
    "DepthHistory",
    "FairShares",
    "FlowLimits",
    "JobRates",
    "JobRecords",
    "Part",
    "ProgressStream",
    "QueueControl",
    "RunLimits",
    "ScheduleMarks",
    "ServerInfo",
    "SharedResults",
    "StartLimits",
    "WorkerStatus",
]

#: Each part's attribute and what a person calls what it keeps (for messages).
PART_NAMES = {
    "records": "job records",
    "status": "worker heartbeats",
    "marks": "schedule marks",
    "history": "depth history",
    "debounce": "debounced jobs",
    "flow_limits": "rate limits and per-key caps",
    "server": "server information",
    "batches": "batch counts",
    "control": "queue pause and the waiting list",
    "rates": "throughput and duration history",
    "fair_shares": "fair shares",
    "run_limits": "run-time limits",
}
