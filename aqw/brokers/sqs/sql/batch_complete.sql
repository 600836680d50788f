-- The batch completes (once: only a batch not complete yet); its row then lives keep_s.
UPDATE {batches} SET state = 'complete', completed_at = extract(epoch FROM clock_timestamp()),
    expires_at = clock_timestamp() + make_interval(secs => keep_s)
WHERE queue = $1 AND id = $2 AND state <> 'complete'
RETURNING total, succeeded, failed, cancelled, expired, key_ttl_s, parent, created_at,
    completed_at, keep_s
