-- $1 queue, $2 held before (epoch), $3 most rows.
SELECT id, job, consumer, held_at FROM {schema}.aqw_jobs
WHERE queue = $1 AND consumer IS NOT NULL AND held_at <= $2
ORDER BY held_at LIMIT $3
