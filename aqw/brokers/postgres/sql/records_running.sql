-- Up to $2 records of queue $1 that read running, oldest start first.
SELECT job_id, fields FROM {schema}.aqw_records
WHERE queue = $1 AND fields->>'state' = 'running'
ORDER BY (NULLIF(fields->>'started_at', '')::float8) LIMIT $2
