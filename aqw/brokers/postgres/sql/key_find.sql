-- The job holding key $2 of queue $1: finished ('done') first, else enqueued ('key').
SELECT job_id FROM {schema}.aqw_keys
WHERE queue = $1 AND key = $2 AND expires_at > $3
ORDER BY kind = 'done' DESC LIMIT 1
