-- aqw PostgreSQL broker, version 3: job records shared across processes.
-- A record is the flat map of string fields of aqw/record.py, as jsonb; it lives until
-- `until` (epoch seconds): keep_for past its end, UNFINISHED_KEEP past its due time before.
CREATE TABLE {schema}.aqw_records (
    queue text NOT NULL,
    job_id text NOT NULL,
    fields jsonb NOT NULL,
    until double precision NOT NULL,
    PRIMARY KEY (queue, job_id)
);
-- The expiry sweep: records past their time, deleted in batches.
CREATE INDEX aqw_records_until ON {schema}.aqw_records (until);
-- The running jobs of a queue (the monitor), oldest start first.
CREATE INDEX aqw_records_running ON {schema}.aqw_records (queue, ((NULLIF(fields->>'started_at', '')::float8)))
    WHERE fields->>'state' = 'running';
