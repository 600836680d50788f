SELECT b.state, b.total, b.succeeded, b.failed, b.cancelled, b.expired, b.fail_fast, b.parent,
    b.data, b.created_at, b.completed_at,
    (SELECT count(*) FROM {members} m
        WHERE m.queue = b.queue AND m.batch_id = b.id AND NOT m.counted) AS pending,
    (SELECT coalesce(array_agg(c.kind || ' ' || c.job_id), '{}') FROM {callbacks} c
        WHERE c.queue = b.queue AND c.batch_id = b.id AND c.fired) AS fired
FROM {batches} b WHERE b.queue = $1 AND b.id = $2 AND b.expires_at > clock_timestamp()
