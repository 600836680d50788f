-- Many acquires in one statement (distinct keys): $1 keys, $2 tokens, $3 ttls in ms. Each
-- lease is taken when free, expired or held by its token; a fencing token is drawn for each
-- lease taken only (RETURNING runs for written rows). The keys taken come back.
INSERT INTO {schema}.aqw_leases AS l (key, token, expires_at)
SELECT k, t, extract(epoch FROM clock_timestamp()) + ms / 1000.0
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(k, t, ms)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= extract(epoch FROM clock_timestamp()) OR l.token = EXCLUDED.token
RETURNING l.key, nextval('{schema}.aqw_fence') AS fence
