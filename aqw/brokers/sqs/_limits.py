"""The SQS limits the broker works within (batch size, long poll, delay, visibility)."""

from __future__ import annotations

import math

MAX_BATCH = 10  # entries in one *Batch call, messages in one ReceiveMessage
MAX_WAIT = 20  # seconds of one long poll
MAX_DELAY = 900  # DelaySeconds
MAX_VISIBILITY = 43_200  # visibility timeout, and how long after a receive it may reach
PEEK_VISIBILITY = 30  # how long a dead-letter scan hides the messages it reads
DLQ_SCAN_LIMIT = 10_000  # most dead-letter messages one scan reads


def visibility_seconds(ttl_ms: int) -> int:
    """A lease TTL as a visibility timeout: whole seconds, 1 to MAX_VISIBILITY."""
    return min(MAX_VISIBILITY, max(1, math.ceil(ttl_ms / 1000)))
