-- The depth sample of one bucket, unless it has one: $1 queue, $2 the bucket's start, $3 now
-- (epoch seconds), $4 the oldest bucket kept. The queue's rows are counted only when the
-- bucket has no sample yet (a one-time filter); samples older than $4 are trimmed.
WITH fresh AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM {schema}.aqw_depth WHERE queue = $1 AND bucket = $2
    ) AS yes
), counted AS (
    SELECT count(*) FILTER (WHERE consumer IS NULL AND run_at <= $3) AS waiting,
           count(*) FILTER (WHERE consumer IS NOT NULL) AS in_flight,
           count(*) FILTER (WHERE consumer IS NULL AND run_at > $3) AS delayed,
           (SELECT count(*) FROM {schema}.aqw_dead WHERE queue = $1) AS dead
    FROM {schema}.aqw_jobs WHERE queue = $1 AND (SELECT yes FROM fresh)
), trimmed AS (
    DELETE FROM {schema}.aqw_depth WHERE queue = $1 AND bucket < $4
)
INSERT INTO {schema}.aqw_depth (queue, bucket, waiting, in_flight, delayed, dead)
SELECT $1, $2, waiting, in_flight, delayed, dead FROM counted WHERE (SELECT yes FROM fresh)
ON CONFLICT (queue, bucket) DO NOTHING
