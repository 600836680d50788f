INSERT INTO {schema}.aqw_heartbeats (queue, worker, data, expires_at)
VALUES ($1, $2, $3, extract(epoch FROM clock_timestamp()) + $4)
ON CONFLICT (queue, worker) DO UPDATE SET data = EXCLUDED.data, expires_at = EXCLUDED.expires_at
