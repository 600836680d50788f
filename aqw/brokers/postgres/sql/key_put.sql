-- $1 queue, $2 kind, $3 key, $4 job id, $5 expires at. A live row of another job is kept.
INSERT INTO {schema}.aqw_keys AS k (queue, kind, key, job_id, expires_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (queue, kind, key) DO UPDATE SET job_id = EXCLUDED.job_id,
    expires_at = EXCLUDED.expires_at
WHERE k.expires_at <= $6 OR k.job_id = EXCLUDED.job_id
RETURNING 1
