-- A job's record moved by one step: $1 queue, $2 job id, $3 what a missing record starts
-- with (JSON: task, enqueued_at), $4 the step's fields (JSON, merged over the record's),
-- $5 the record's new expiry (epoch seconds).
INSERT INTO {schema}.aqw_records AS r (queue, job_id, fields, until)
VALUES ($1, $2, $3::jsonb || $4::jsonb, $5)
ON CONFLICT (queue, job_id) DO UPDATE SET fields = r.fields || $4::jsonb, until = EXCLUDED.until
