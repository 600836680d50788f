INSERT INTO {schema}.aqw_outbox (queue, job, run_at) VALUES ($1, $2, $3)
