SELECT worker, data FROM {schema}.aqw_heartbeats
WHERE queue = $1 AND expires_at > extract(epoch FROM clock_timestamp())
ORDER BY worker
