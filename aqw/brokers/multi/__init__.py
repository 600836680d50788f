"""One worker on several queues: ``MultiBroker``, the ``queues=`` plan."""

from ._broker import MultiBroker, queue_of
from ._plan import QueuePlan, check_queue, queue_plan

__all__ = ["MultiBroker", "QueuePlan", "check_queue", "queue_of", "queue_plan"]
