-- A running record's progress, message and lease expiry ($3, JSON), only while it runs under
-- fencing token $4 (NULL: any holder).
UPDATE {schema}.aqw_records SET fields = fields || $3::jsonb
WHERE queue = $1 AND job_id = $2 AND fields->>'state' = 'running'
  AND ($4::text IS NULL OR fields->>'fencing_token' = $4)
