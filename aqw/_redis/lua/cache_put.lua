-- Compare-and-set a cache entry by version. A writer can never replace a newer entry.
-- KEYS[1] entry hash (fields v = version, d = JSON payload), KEYS[2] version counter
-- ARGV[1] version of the value ('' = the current counter), ARGV[2] JSON payload, ARGV[3] ttl in ms
-- Refused (returns 0) when the version is older than the counter or than the stored entry.
-- A version newer than the counter raises the counter, so no entry is ever above the counter.
-- Returns 1 when stored.
local current = redis.call('GET', KEYS[2]) or '0'
local version = ARGV[1]
if version == '' then
  version = current
end
local v = tonumber(version)
if v < tonumber(current) then
  return 0
end
local stored = redis.call('HGET', KEYS[1], 'v')
if stored and tonumber(stored) > v then
  return 0
end
if v > tonumber(current) then
  redis.call('SET', KEYS[2], version)
end
redis.call('HSET', KEYS[1], 'v', version, 'd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
