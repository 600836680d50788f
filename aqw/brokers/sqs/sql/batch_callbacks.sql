SELECT kind, job, job_id, fired FROM {callbacks} WHERE queue = $1 AND batch_id = $2
FOR UPDATE
