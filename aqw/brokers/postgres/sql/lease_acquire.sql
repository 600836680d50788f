-- $1 key, $2 token, $3 ttl ms, $4 queue. The lease is taken when free, expired or held by
-- this token; only then does the queue's fencing token move on, in the same statement.
WITH taken AS (
    INSERT INTO {schema}.aqw_leases AS l (key, token, expires_at)
    VALUES ($1, $2, extract(epoch FROM clock_timestamp()) + $3 / 1000.0)
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
    WHERE l.expires_at <= extract(epoch FROM clock_timestamp()) OR l.token = EXCLUDED.token
    RETURNING 1
)
INSERT INTO {schema}.aqw_fences AS f (queue, value)
SELECT $4, 1 FROM taken
ON CONFLICT (queue) DO UPDATE SET value = f.value + 1
RETURNING value
