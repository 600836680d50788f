"""The in-process parts of a broker: job records, worker heartbeats, schedule marks, depth
history, debounce, rate limits and per-key caps, leases and priority levels kept in this
process. The memory broker is made of them; a broker with no shared store for one of them
(SQS) uses it too, and says so (``shared = False``)."""
