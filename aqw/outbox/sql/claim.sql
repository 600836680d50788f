-- The oldest committed rows no other relay holds, locked until this transaction ends.
SELECT id, queue, job, run_at FROM {schema}.aqw_outbox
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
