-- $1 queue, $2 job wire forms, $3 their priorities, $4 due time, $5 the queue's channel.
WITH ins AS (
    INSERT INTO {schema}.aqw_jobs (queue, job, priority, run_at)
    SELECT $1, j, p, $4 FROM unnest($2::bytea[], $3::smallint[]) AS t(j, p)
    RETURNING 1
)
SELECT pg_notify($5, '') FROM (SELECT count(*) FROM ins) AS c
