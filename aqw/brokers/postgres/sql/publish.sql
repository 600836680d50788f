-- $1 queue, $2 job wire forms, $3 their priorities, $4 due time, $5 the queue's channel;
-- the jobs' records, written in the same statement: $6 job ids, $7 their fields (JSON),
-- $8 until (empty arrays: no record written, e.g. a replay that keeps the record's story).
WITH ins AS (
    INSERT INTO {schema}.aqw_jobs (queue, job, priority, run_at)
    SELECT $1, j, p, $4 FROM unnest($2::bytea[], $3::smallint[]) AS t(j, p)
    RETURNING 1
), rec AS (
    INSERT INTO {schema}.aqw_records AS r (queue, job_id, fields, until)
    SELECT DISTINCT ON (i) $1, i, f::jsonb, u  -- a job published twice: its last record
    FROM unnest($6::text[], $7::text[], $8::float8[]) WITH ORDINALITY AS t(i, f, u, n)
    ORDER BY i, n DESC
    ON CONFLICT (queue, job_id) DO UPDATE SET fields = EXCLUDED.fields, until = EXCLUDED.until
    RETURNING 1
)
SELECT pg_notify($5, '') FROM (SELECT count(*) FROM ins) AS c
