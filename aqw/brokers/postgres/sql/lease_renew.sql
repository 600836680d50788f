UPDATE {schema}.aqw_leases SET expires_at = extract(epoch FROM clock_timestamp()) + $3 / 1000.0
WHERE key = $1 AND token = $2 AND expires_at > extract(epoch FROM clock_timestamp())
RETURNING 1
