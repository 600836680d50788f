-- Read a cache entry and the key's version counter in one atomic step.
-- KEYS[1] entry hash (fields v = version, d = JSON payload), KEYS[2] version counter
-- Returns {current version, entry version or false, entry payload or false}.
local current = redis.call('GET', KEYS[2]) or '0'
local entry = redis.call('HMGET', KEYS[1], 'v', 'd')
return {current, entry[1], entry[2]}
