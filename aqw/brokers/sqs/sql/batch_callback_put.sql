INSERT INTO {callbacks} (queue, batch_id, kind, job, job_id) VALUES ($1, $2, $3, $4, $5)
