-- A running job handed back unfinished reads queued again ($3 its new expiry).
UPDATE {schema}.aqw_records SET fields = fields || '{"state": "queued"}'::jsonb, until = $3
WHERE queue = $1 AND job_id = $2 AND fields->>'state' = 'running'
