-- Invalidate a cache entry: delete it and bump the version counter in one atomic step, so a
-- load that read the old version can no longer store its (stale) value.
-- KEYS[1] entry hash, KEYS[2] version counter. Returns the new version.
redis.call('DEL', KEYS[1])
return redis.call('INCR', KEYS[2])
