"""Workflows: batches whose callbacks are enqueued exactly once (``Batch``), on the broker's
``BatchCounts`` part, counted in each child's own settle step."""

from ._batch import Batch, BatchApp, Build, batch_part

__all__ = ["Batch", "BatchApp", "Build", "batch_part"]
