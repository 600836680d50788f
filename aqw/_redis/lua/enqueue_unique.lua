-- Enqueue a job under an idempotency key: at most one job per key while its record lives.
-- The check and the write are one step, so concurrent producers cannot both enqueue. The
-- job's record (aqw/record.py) is written in the same step, as enqueue.lua writes it.
-- KEYS[1] idempotency record, KEYS[2] stream, KEYS[3] delayed zset, KEYS[4] completion record,
-- KEYS[5] the job's record
-- ARGV[1] job id, ARGV[2] idempotency record ttl in ms, ARGV[3] job JSON, ARGV[4] due time in
-- ms (0: now), ARGV[5] run_at (seconds; '' unless due later), ARGV[6] task, ARGV[7] attempts,
-- ARGV[8] enqueued_at, ARGV[9] expires_at ('' none), ARGV[10] key, ARGV[11] job record ttl ms
-- Returns {job id, 1 if the key already had a job (nothing written) else 0}. All or nothing:
-- the numbers are checked before the first write.
local function ms(value, low)
  local n = tonumber(value)
  if n and n == n and n >= low and n <= 1e14 and n % 1 == 0 then
    return n
  end
  return nil
end
if not ms(ARGV[2], 1) or not ms(ARGV[4], 0) or not ms(ARGV[11], 1) then
  return redis.error_reply('ERR aqw enqueue: bad key ttl, due time or record ttl; nothing written')
end
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
local rec = KEYS[5]
redis.call('DEL', rec)
if ARGV[5] ~= '' then
  redis.call('HSET', rec, 'state', 'delayed', 'run_at', ARGV[5])
else
  redis.call('HSET', rec, 'state', 'queued')
end
redis.call('HSET', rec, 'task', ARGV[6], 'attempts', ARGV[7], 'enqueued_at', ARGV[8],
  'expires_at', ARGV[9], 'key', ARGV[10])
redis.call('PEXPIRE', rec, ARGV[11])
return {ARGV[1], 0}
