"""The transactional outbox: ``await task.enqueue(payload, conn=conn)`` writes the job as a
row in the caller's PostgreSQL transaction, and a relay run by every worker (one leads,
under a fenced lease) publishes committed rows to the app's broker exactly once. See
``docs/concepts/outbox.md``."""

from __future__ import annotations

from ._outbox import Outbox, OutboxStatus, as_outbox
from ._relay import RELAY_LOCK, Relay, RelayApp, check_relay
from ._sql import migrations

__all__ = [
    "RELAY_LOCK",
    "Outbox",
    "OutboxStatus",
    "Relay",
    "RelayApp",
    "as_outbox",
    "check_relay",
    "migrations",
]
