-- Schedule a failed job to run again: add the next attempt to the delayed set, acknowledge and
-- delete the failed entry and release the lease, in one step, so a crash leaves either the
-- old entry pending (it is redelivered) or the new one scheduled, never both and never none.
-- The job's record (aqw/record.py) reads retrying (its run_at, runs so far and last error)
-- in the same step, lives the given ttl and leaves the running index; a record key of
-- another type than a hash is left alone.
-- KEYS[1] stream, KEYS[2] delayed zset, KEYS[3] lease key, KEYS[4] stats hash, KEYS[5] job
--   record, KEYS[6] running index
-- ARGV[1] group, ARGV[2] lease token ('' for none), ARGV[3] entry id,
-- ARGV[4] due time (ms since the epoch), ARGV[5] next attempt's job JSON, ARGV[6] consumer,
-- ARGV[7] job id, ARGV[8] record ttl in ms, ARGV[9..] record field/value pairs
-- Returns 1 when scheduled, 0 when refused (another holder owns the lease, or the lease key is
-- absent and the entry is no longer pending to this consumer: another consumer claimed it).
local cur = redis.call('GET', KEYS[3])
if cur and cur ~= ARGV[2] then
  return 0
end
if not cur then
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
  if #p == 0 or p[1][2] ~= ARGV[6] then
    return 0
  end
end
-- No longer pending: another holder settled it after this one's lease expired.
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[3]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('XDEL', KEYS[1], ARGV[3])
if cur then
  redis.call('DEL', KEYS[3])
end
redis.call('HINCRBY', KEYS[4], 'retried', 1)
local was = redis.pcall('HGET', KEYS[5], 'state')
if type(was) ~= 'table' then
  if #ARGV >= 9 then
    redis.call('HSET', KEYS[5], unpack(ARGV, 9))
  end
  redis.call('PEXPIRE', KEYS[5], ARGV[8])
  redis.call('HDEL', KEYS[5], 'indexed')
end
redis.call('ZREM', KEYS[6], ARGV[7])
return 1
