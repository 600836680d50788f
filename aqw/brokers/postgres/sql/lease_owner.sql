-- The live holder's token of lease $1, the row locked until the transaction ends.
SELECT token FROM {schema}.aqw_leases
WHERE key = $1 AND expires_at > extract(epoch FROM clock_timestamp())
FOR UPDATE
