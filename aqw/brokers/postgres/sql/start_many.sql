-- Many job starts in one statement (distinct lease keys): $1 queue, $2 job ids, $3 their
-- lease keys, $4 tokens, $5 ttls in ms, $6 what a missing record starts with (JSON), $7 the
-- running record's fields but the fencing token (JSON), $8 its expiry, $9 the deliveries'
-- row ids (NULL: none to check), $10 their consumers. A job whose row is no longer held by
-- its consumer (another consumer reclaimed it, or it settled) comes back 'gone', taking
-- nothing: the start's check of its delivery, in the start itself. Each job's live record is locked,
-- in job id order, before its lease (the order every start and settle locks a job's record, lease
-- and row in: two statements on the same jobs wait for each other in turn, never in a cycle);
-- a cancelled job comes back 'cancelled', an ended one 'ended', taking nothing; the others
-- take their lease (free, expired or held by their token), and for each lease taken the
-- record reads running with the lease's fencing token. Every job comes back: its status and
-- its fencing token (NULL: the lease is another holder's).
WITH req AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[],
                         $7::text[], $9::bigint[], $10::text[])
                  AS r(job_id, key, token, ms, b, f, row_id, consumer)
), rec AS (
    SELECT r.job_id, r.fields FROM {schema}.aqw_records AS r JOIN req USING (job_id)
    WHERE r.queue = $1 AND r.until > extract(epoch FROM clock_timestamp())
    ORDER BY r.job_id
    FOR UPDATE OF r
), checked AS (
    SELECT req.*, CASE
        WHEN req.row_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM {schema}.aqw_jobs AS j
            WHERE j.id = req.row_id AND j.consumer = req.consumer
        ) THEN 'gone'
        WHEN rec.fields->>'state' = 'cancelled' OR rec.fields->>'cancel' = '1' THEN 'cancelled'
        WHEN rec.fields->>'state' IN ('succeeded', 'failed', 'dead', 'expired') THEN 'ended'
        ELSE 'go' END AS status
    FROM req LEFT JOIN rec USING (job_id)
), taken AS (
    INSERT INTO {schema}.aqw_leases AS l (key, token, expires_at)
    SELECT key, token, extract(epoch FROM clock_timestamp()) + ms / 1000.0
    FROM checked WHERE status = 'go'
    ORDER BY key
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
    WHERE l.expires_at <= extract(epoch FROM clock_timestamp()) OR l.token = EXCLUDED.token
    RETURNING l.key, nextval('{schema}.aqw_fence') AS fence
), running AS (
    INSERT INTO {schema}.aqw_records AS r (queue, job_id, fields, until)
    SELECT $1, checked.job_id,
           checked.b::jsonb || checked.f::jsonb
               || jsonb_build_object('fencing_token', taken.fence::text),
           $8::float8
    FROM checked JOIN taken USING (key)
    ON CONFLICT (queue, job_id) DO UPDATE
    SET fields = r.fields || (EXCLUDED.fields - ARRAY['task', 'enqueued_at']),
        until = EXCLUDED.until
    RETURNING 1
)
SELECT checked.job_id, checked.status, taken.fence FROM checked LEFT JOIN taken USING (key)
