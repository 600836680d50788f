"""Amazon SQS broker (aioboto3): long polling, batched receives, deletes and visibility changes,
the visibility timeout as the job lease, the queue's own RedrivePolicy and a dead-letter queue.

URL forms (options after ``?`` in both)::

    sqs://QUEUE_NAME?region=us-east-1&endpoint_url=http://127.0.0.1:4566&dlq=NAME
    sqs://https://sqs.eu-west-1.amazonaws.com/123456789012/jobs?dlq=jobs-dead

Options: ``region``, ``endpoint_url``, ``dlq`` (dead-letter queue name, or ``none`` to drop dead
jobs with an error log; default: the target of the queue's RedrivePolicy), ``wait`` (long-poll
seconds, 0-20, overriding the runtime's block), ``visibility`` (visibility timeout asked for on
receive; default: the queue's), ``task`` (the task that consumes plain-JSON bodies of other
producers), ``create=1`` (create missing queues; otherwise a missing queue is a ConfigError),
``locks`` (a ``redis://`` URL for real leases and fencing next to SQS), ``records`` (a
``redis://`` or ``postgresql://`` URL: the store of idempotency-key records, which
``enqueue(key=...)`` needs), ``pool`` (HTTP connections, default 50) and ``pollers`` (most
concurrent ReceiveMessage calls, default 10).

How aqw's model maps onto SQS:

- **Lease = visibility.** ``job_lease_key(job)`` is the usual ``aqw:{queue}:lease:<job id>``.
  ``fetch`` reads each message's job id (the ``aqw-job-id`` attribute, else the body) and keeps
  ``lease key -> message id -> latest receipt handle``. ``renew`` is a ChangeMessageVisibility
  (batched with the renewals due at the same moment); a receipt SQS no longer accepts
  (ReceiptHandleIsInvalid, InvalidParameterValue, MessageNotInflight) refuses the renewal, so
  the Lease cancels the handler with LeaseLost. ``acquire`` makes no call unless the message's
  visibility would run out before the first renewal, and ``release`` only forgets the handle.
  The fencing token is the message's ApproximateReceiveCount: it grows with every delivery of
  one message but SQS gives no hard guarantee. For real fencing, and for ``ctx.lock()`` across
  processes, pass ``locks=redis://...``; without it resource locks are local to this process.
- **Attempts = receives.** ``retry()`` changes the visibility to the backoff delay instead of
  sending a new message (the body cannot change), so ApproximateReceiveCount grows and the
  queue's RedrivePolicy fires. ``fetch`` rewrites the envelope's ``attempt`` to
  ``max(attempt, ApproximateReceiveCount)``: every receive counts as an attempt, including one
  ended by a crash or a shutdown. A retry delay is capped at 12 h from the receive.
- **Delays.** ``schedule`` sends with DelaySeconds (<= 900 s). Longer delays are sent with
  DelaySeconds=900 and an ``aqw-not-before`` attribute; a message received before that time is
  not handed out: it is hidden again with a visibility change (<= 12 h, while the queue's redrive
  limit is not near) and, for the last stretch, re-sent as a fresh message (then deleted), so the
  job's first run starts at receive count 1. FIFO queues refuse per-message delays: ConfigError.
- **Groups.** The job header ``aqw-group`` (``@app.task(group_key=...)``, checked at enqueue)
  is the MessageGroupId: on a standard queue, a fair queue's tenant (sent only when set).
- **FIFO.** MessageGroupId is the job header ``aqw-group`` or else the task name;
  MessageDeduplicationId the idempotency key or the job id. SQS hands out several messages of
  one group in one receive, and aqw runs jobs concurrently, so on FIFO queues every
  ReceiveMessage asks for one message (concurrent calls still return other groups): a group
  then never has two messages in flight and runs in order, retries included.
- **Dead letters** go to the DLQ queue with the error in the ``aqw-failure`` attribute (JSON:
  type, message, traceback tail, attempts, worker, times), then the original is deleted (a
  failed delete can leave a copy in both). Listing peeks (receive with a 30 s visibility, then
  visibility 0): approximate, oldest first by SentTimestamp, at most 10,000 messages scanned.
  Replay sends back to the queue then deletes from the DLQ; delete receives and deletes the
  matching message ids. Messages the queue's RedrivePolicy moved show as
  ``MaxReceiveCountExceeded``.
- **Idempotency keys** need ``records=``: an enqueue claims the key in that store for 60 s,
  sends, then keeps the key for the idempotency TTL; the ack writes the completion record
  before the delete. Steps, schema and failure windows: ``aqw.brokers.sqs._keys``.
- **Batches** need ``records=redis://``: each child is counted in the store's atomic step at
  its settle, before the delete; the callbacks go through the store's outbox. Steps and
  what holds: ``aqw.brokers.sqs._batches``.
- **Job records** (``app.job``, ``app.result``, ``app.cancel``) are kept in the process, per
  broker (``Broker.local_records``): the settle steps keep them, but other processes do not
  see them.
- A fetch cancelled during a long poll gives whatever the poll still returns back at once.
"""

from ._broker import SQSBroker
from ._errors import RecordsUnavailable, SQSUnavailable
from ._limits import DLQ_SCAN_LIMIT, MAX_BATCH, MAX_DELAY, MAX_VISIBILITY, MAX_WAIT, PEEK_VISIBILITY
from ._messages import FAILURE, NOT_BEFORE

__all__ = [
    "DLQ_SCAN_LIMIT",
    "FAILURE",
    "MAX_BATCH",
    "MAX_DELAY",
    "MAX_VISIBILITY",
    "MAX_WAIT",
    "NOT_BEFORE",
    "PEEK_VISIBILITY",
    "RecordsUnavailable",
    "SQSBroker",
    "SQSUnavailable",
]
