-- Update a running job's record (progress, message, lease expiry) only while it reads running
-- under the caller's fencing token, and list it in the running index (what `aqw status` and
-- the monitor read; ack.lua takes it out): a job that has ended (or runs again elsewhere) is
-- never changed, and a missing record is never recreated. The record keeps its TTL, unless
-- less than half of the given ttl is left (a job running for days): then it gets that ttl.
-- KEYS[1] record, KEYS[2] running index
-- ARGV[1] fencing token, ARGV[2] record ttl in ms, ARGV[3] job id, ARGV[4] started_at (its
--   score in the index), ARGV[5..] field/value pairs
-- Returns 1 when updated, 0 when not.
local cur = redis.pcall('HMGET', KEYS[1], 'state', 'fencing_token', 'indexed')
if cur.err or cur[1] ~= 'running' or cur[2] ~= ARGV[1] then
  return 0
end
if #ARGV > 4 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 5))
end
if not cur[3] then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
  redis.call('HSET', KEYS[1], 'indexed', '1')
end
local keep = tonumber(ARGV[2])
if redis.call('PTTL', KEYS[1]) < keep / 2 then
  redis.call('PEXPIRE', KEYS[1], keep)
end
return 1
