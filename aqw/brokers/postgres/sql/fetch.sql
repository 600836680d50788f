-- $1 queue, $2 most rows, $3 consumer, $4 now (epoch seconds).
WITH picked AS (
    SELECT id FROM {schema}.aqw_jobs
    WHERE queue = $1 AND consumer IS NULL AND run_at <= $4
    ORDER BY priority DESC, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.aqw_jobs AS j
SET consumer = $3, held_at = $4, deliveries = j.deliveries + 1
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.job, j.deliveries, j.priority
