DELETE FROM {schema}.aqw_leases
WHERE key = $1 AND token = $2 AND expires_at > extract(epoch FROM clock_timestamp())
RETURNING 1
