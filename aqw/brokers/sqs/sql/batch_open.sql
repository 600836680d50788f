INSERT INTO {batches} (queue, id, state, fail_fast, keep_s, key_ttl_s, parent, data,
    created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, extract(epoch FROM clock_timestamp()),
    clock_timestamp() + make_interval(secs => $9))
ON CONFLICT (queue, id) DO NOTHING
RETURNING created_at
