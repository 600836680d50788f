-- Many acks of one consumer in one statement: $1 row ids, $2 their jobs' lease keys, $3 the
-- leases' tokens ('': none held), $4 completion-record keys (NULL: none), $5 job ids ('':
-- undecodable), $6 the records' expiries; $7 this consumer, $8 queue, $9 stats shard; the
-- job records' ends: $10 the finish's fields (JSON; '': no record), $11 the records' new
-- expiry, $12 what a missing record starts with (JSON), $13 the records' channel (the ends
-- notified with their job ids). Each row goes when its holder is its lease's token, or,
-- without a live lease, this consumer; the ids gone come back. The jobs' records are locked
-- first (in job id order), then their leases (in key order), then their rows (in id order):
-- the order every start and settle locks them in, so an ack and another holder's start or
-- settle of the same jobs wait for each other in turn, never in a cycle.
WITH req AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::float8[], $10::text[], $11::float8[], $12::text[])
                  AS r(id, lkey, token, jkey, job_id, expires, f, u, b)
), records_first AS (
    SELECT r.job_id FROM {schema}.aqw_records AS r
    WHERE r.queue = $8 AND r.job_id IN (SELECT job_id FROM req WHERE job_id <> '')
    ORDER BY r.job_id
    FOR UPDATE OF r
), lease AS (
    SELECT l.key, l.token FROM {schema}.aqw_leases AS l JOIN req ON l.key = req.lkey
    WHERE l.expires_at > extract(epoch FROM clock_timestamp())
      AND (SELECT count(*) FROM records_first) >= 0  -- evaluated first, once
    ORDER BY l.key
    FOR UPDATE OF l
), mine AS (
    SELECT j.id, req.lkey, req.token, req.jkey, req.job_id, req.expires, req.f, req.u, req.b
    FROM {schema}.aqw_jobs AS j JOIN req ON j.id = req.id
    LEFT JOIN lease ON lease.key = req.lkey
    WHERE j.consumer IS NOT NULL
      AND CASE WHEN lease.key IS NOT NULL THEN lease.token = req.token ELSE j.consumer = $7 END
    ORDER BY j.id
    FOR UPDATE OF j
), released AS (
    DELETE FROM {schema}.aqw_leases AS l USING mine
    WHERE l.key = mine.lkey AND l.token = mine.token
    RETURNING 1
), gone AS (
    DELETE FROM {schema}.aqw_jobs AS j USING mine WHERE j.id = mine.id RETURNING j.id
), counted AS (
    INSERT INTO {schema}.aqw_stats AS s (queue, name, shard, value)
    SELECT $8, 'processed', $9, count(*) FROM gone JOIN mine USING (id)
    WHERE mine.job_id <> '' HAVING count(*) > 0
    ON CONFLICT (queue, name, shard) DO UPDATE SET value = s.value + EXCLUDED.value
    RETURNING 1
), done AS (
    INSERT INTO {schema}.aqw_keys AS k (queue, kind, key, job_id, expires_at)
    SELECT $8, 'done', mine.jkey, mine.job_id, mine.expires FROM gone JOIN mine USING (id)
    WHERE mine.jkey IS NOT NULL
    ON CONFLICT (queue, kind, key) DO UPDATE
    SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at
    RETURNING 1
), rec AS (
    INSERT INTO {schema}.aqw_records AS r (queue, job_id, fields, until)
    SELECT DISTINCT ON (mine.job_id) $8, mine.job_id, mine.b::jsonb || mine.f::jsonb, mine.u
    FROM gone JOIN mine USING (id) WHERE mine.f <> '' AND mine.job_id <> ''
    ORDER BY mine.job_id, mine.id DESC
    ON CONFLICT (queue, job_id) DO UPDATE
    SET fields = r.fields || (EXCLUDED.fields - ARRAY['task', 'enqueued_at']),
        until = EXCLUDED.until
    RETURNING r.job_id
)
-- The ends are notified a few per notification (ids joined by ',', payloads under 8000
-- bytes): one per job cost each listening process a callback per job.
SELECT gone.id FROM gone, (
    SELECT count(pg_notify($13, ids)) AS n FROM (
        SELECT string_agg(job_id, ',') AS ids FROM (
            SELECT job_id, sum(octet_length(job_id) + 1) OVER (ORDER BY job_id) / 7000 AS part
            FROM rec
        ) AS sized GROUP BY part
    ) AS parts
) AS notified
