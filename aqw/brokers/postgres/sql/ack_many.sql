-- Many acks of one consumer in one statement: $1 row ids, $2 their jobs' lease keys, $3 the
-- leases' tokens ('': none held), $4 completion-record keys (NULL: none), $5 job ids ('':
-- undecodable), $6 the records' expiries; $7 this consumer, $8 queue, $9 stats shard. Each
-- row goes when its holder is its lease's token, or, without a live lease, this consumer;
-- the ids gone come back.
WITH req AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::float8[]) AS r(id, lkey, token, jkey, job_id, expires)
), lease AS (
    SELECT l.key, l.token FROM {schema}.aqw_leases AS l JOIN req ON l.key = req.lkey
    WHERE l.expires_at > extract(epoch FROM clock_timestamp())
    FOR UPDATE OF l
), mine AS (
    SELECT j.id, req.lkey, req.token, req.jkey, req.job_id, req.expires
    FROM {schema}.aqw_jobs AS j JOIN req ON j.id = req.id
    LEFT JOIN lease ON lease.key = req.lkey
    WHERE j.consumer IS NOT NULL
      AND CASE WHEN lease.key IS NOT NULL THEN lease.token = req.token ELSE j.consumer = $7 END
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
)
SELECT id FROM gone
