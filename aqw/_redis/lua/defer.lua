-- Put a job off until later without spending an attempt (a rate limit or a per-key cap
-- refused its start, or its handler raised aqw.RateLimited): add the same job to the delayed
-- set, acknowledge and delete its entry and release its lease (when it holds one), in one
-- step, as retry.lua does for a failed attempt. Its record reads delayed (its run_at, its
-- attempts unchanged) and leaves the running index; a record key of another type than a hash
-- is left alone. Counted in the stats hash as deferred.
-- KEYS[1] stream, KEYS[2] delayed zset, KEYS[3] lease key, KEYS[4] stats hash, KEYS[5] job
--   record, KEYS[6] running index
-- ARGV[1] group, ARGV[2] lease token ('' for none), ARGV[3] entry id,
-- ARGV[4] due time (ms since the epoch), ARGV[5] job JSON, ARGV[6] consumer, ARGV[7] job id,
-- ARGV[8] record ttl in ms, ARGV[9] run_at (seconds), ARGV[10] attempts so far
-- Returns 1 when deferred, 0 when refused (another holder owns the lease, or the lease key is
-- absent and the entry is no longer pending to this consumer: another consumer claimed it).
local cur = redis.call('GET', KEYS[3])
if cur and cur ~= ARGV[2] then
  return 0
end
if not cur or ARGV[2] == '' then
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
  if #p == 0 or p[1][2] ~= ARGV[6] then
    return 0
  end
end
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[3]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('XDEL', KEYS[1], ARGV[3])
if cur then
  redis.call('DEL', KEYS[3])
end
redis.call('HINCRBY', KEYS[4], 'deferred', 1)
local was = redis.pcall('HGET', KEYS[5], 'state')
if type(was) ~= 'table' then
  redis.call('HSET', KEYS[5], 'state', 'delayed', 'run_at', ARGV[9], 'attempts', ARGV[10])
  redis.call('PEXPIRE', KEYS[5], ARGV[8])
  redis.call('HDEL', KEYS[5], 'indexed')
end
redis.call('ZREM', KEYS[6], ARGV[7])
return 1
