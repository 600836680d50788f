-- Enqueue a job under an idempotency key: at most one job per key while its record lives.
-- The check and the write are one step, so concurrent producers cannot both enqueue.
-- KEYS[1] idempotency record, KEYS[2] stream, KEYS[3] delayed zset, KEYS[4] completion record
-- ARGV[1] job id, ARGV[2] record ttl in ms, ARGV[3] job JSON, ARGV[4] due time in ms (0: now)
-- Returns {job id, 1 if the key already had a job (nothing written) else 0}.
local existing = redis.call('GET', KEYS[1])
if existing then
  return {existing, 1}
end
-- A finished job's completion record can outlive its enqueue record: the key is still taken.
local done = redis.call('GET', KEYS[4])
if done then
  return {done, 1}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if tonumber(ARGV[4]) > 0 then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
else
  redis.call('XADD', KEYS[2], '*', 'j', ARGV[3])
end
return {ARGV[1], 0}
