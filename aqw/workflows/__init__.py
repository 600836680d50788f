"""Workflows: batches whose callbacks are enqueued exactly once (``Batch``) and flows of
steps with edges (``Flow``), on the broker's ``BatchCounts`` part, counted in each child's
own settle step."""

from ._batch import Batch, BatchApp, Build, batch_part
from ._flow import Flow, FlowInfo, Step, StepInfo, flow_info, read_flow, start_flow

__all__ = [
    "Batch",
    "BatchApp",
    "Build",
    "Flow",
    "FlowInfo",
    "Step",
    "StepInfo",
    "batch_part",
    "flow_info",
    "read_flow",
    "start_flow",
]
