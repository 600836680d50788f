-- Job $2's record on queue $1 while it lives ($3 now; NULL: even past its time).
SELECT fields, until FROM {schema}.aqw_records
WHERE queue = $1 AND job_id = $2 AND ($3::float8 IS NULL OR until > $3)
