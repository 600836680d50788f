"""The in-process parts of a broker: job records, worker heartbeats, schedule marks, depth
history, debounce, pause and the waiting list, rates, rate limits and per-key caps, the
job's start, leases and priority levels, all kept in this process (each part says
``shared = False``). The memory broker is made of them; a broker with no shared store for a
part (SQS, or one written outside aqw) may use them.
"""

from .batches import LocalBatchCounts
from .control import LocalQueueControl
from .debounce import LocalDebounce
from .fair import FairLevel, LocalFairShares
from .history import LocalDepthHistory
from .leases import MemoryLeaseBackend
from .limits import LocalLimiter
from .marks import LocalScheduleMarks
from .priorities import LevelFifos, ShareCredit, level_of
from .progress import LocalProgress
from .rates import LocalJobRates
from .records import LocalJobRecords
from .run_limits import LocalRunLimits, OverrideCache, StoredRunLimits
from .start import LimitedStart, LocalStartGuard, still_ours
from .status import LocalWorkerStatus
from .wakeup import Wakeup, resolve

__all__ = [
    "FairLevel",
    "LevelFifos",
    "LimitedStart",
    "LocalBatchCounts",
    "LocalDebounce",
    "LocalDepthHistory",
    "LocalFairShares",
    "LocalJobRates",
    "LocalJobRecords",
    "LocalLimiter",
    "LocalProgress",
    "LocalQueueControl",
    "LocalRunLimits",
    "LocalScheduleMarks",
    "LocalStartGuard",
    "LocalWorkerStatus",
    "MemoryLeaseBackend",
    "OverrideCache",
    "ShareCredit",
    "StoredRunLimits",
    "Wakeup",
    "level_of",
    "resolve",
    "still_ours",
]
