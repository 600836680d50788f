-- $1 key, $2 token, $3 ttl ms. The lease is taken when free, expired or held by this
-- token; only then is a fencing token drawn (RETURNING runs for a written row only), from
-- the schema's sequence: strictly increasing, and no row lock for concurrent acquires.
INSERT INTO {schema}.aqw_leases AS l (key, token, expires_at)
VALUES ($1, $2, extract(epoch FROM clock_timestamp()) + $3 / 1000.0)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= extract(epoch FROM clock_timestamp()) OR l.token = EXCLUDED.token
RETURNING nextval('{schema}.aqw_fence')
