"""Which batch counts an SQS queue gets: those of its ``records=`` store (aqw's Redis store
or its PostgreSQL one), or none."""

from __future__ import annotations

from ._batches import Send, StoreBatchCounts, StoreCounts
from ._keys import Keys


def store_batches(keys: Keys, send: Send) -> StoreCounts | None:
    """The batch counts of a queue whose ``records=`` store is aqw's Redis one, or aqw's
    PostgreSQL one (``aqw.brokers.sqs._batches_pg``, imported only then: asyncpg), else None
    (no batches: ``app.batch`` refuses them in one line)."""
    store = keys.redis_store()
    if store is not None:
        return StoreBatchCounts(keys.queue, lambda: store.client, send)
    pg = keys.postgres_store()
    if pg is None:
        return None
    from ._batches_pg import PostgresBatchCounts  # asyncpg: the optional 'postgres' extra

    return PostgresBatchCounts(keys.queue, pg, send)
