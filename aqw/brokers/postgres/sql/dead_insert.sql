INSERT INTO {schema}.aqw_dead (queue, data, task, job_id, error_type, error, traceback,
    attempts, first_failed_at, last_failed_at, worker)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
RETURNING id
