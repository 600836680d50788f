-- Claim row $1 for $2 at $3 if nobody touched it since it was seen ($4 holder, $5 held_at)
-- and its job's lease $6 has no live holder.
UPDATE {schema}.aqw_jobs SET consumer = $2, held_at = $3, deliveries = deliveries + 1
WHERE id = $1 AND consumer = $4 AND held_at = $5
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.aqw_leases
      WHERE key = $6 AND expires_at > extract(epoch FROM clock_timestamp())
  )
RETURNING deliveries
