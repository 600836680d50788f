INSERT INTO {schema}.aqw_marks AS m (queue, task, tick, job_id) VALUES ($1, $2, $3, $4)
ON CONFLICT (queue, task) DO UPDATE SET tick = EXCLUDED.tick, job_id = EXCLUDED.job_id
WHERE m.tick <= EXCLUDED.tick
