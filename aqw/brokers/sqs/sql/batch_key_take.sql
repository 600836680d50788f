-- The callback's idempotency key batch:<id>:<kind> in the keys' table, taken for its job
-- unless a live record holds it (then nothing is enqueued: the job exists already).
INSERT INTO {keys} AS k (queue, key, job_id, state, expires_at)
VALUES ($1, $2, $3, 'queued', clock_timestamp() + make_interval(secs => $4))
ON CONFLICT (queue, key) DO UPDATE
    SET job_id = EXCLUDED.job_id, state = 'queued', expires_at = EXCLUDED.expires_at
    WHERE k.expires_at <= clock_timestamp()
RETURNING 1
