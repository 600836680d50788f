WITH sent AS (INSERT INTO {outbox} (queue, job) VALUES ($1, $4))
UPDATE {callbacks} SET fired = true WHERE queue = $1 AND batch_id = $2 AND kind = $3
