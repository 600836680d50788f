-- Enqueue jobs and write their records in one step: per job, XADD it to the stream (or ZADD
-- it to the delayed set when it is due later) and write a fresh record (aqw/record.py):
-- queued (delayed when due later), its task and enqueue time, and its run_at, expires_at and
-- key when it has them, living for the given ttl (UNFINISHED_KEEP past its due time).
-- Mergeable (aqw/_redis/batch.py): concurrent single enqueues share one call. What the jobs
-- of one enqueue call share is passed once; the record keys are built here from the queue's
-- prefix (all in the queue's slot).
-- KEYS[1] stream, KEYS[2] delayed zset
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] record ttl in ms, ARGV[3] due time in ms (0: now,
--   into the stream), ARGV[4] run_at (seconds; '' unless due later), ARGV[5] expires_at
--   ('' none), ARGV[6] idempotency key ('' none), then per job (4): job JSON, job id, task,
--   enqueued_at
-- Returns one reply per job: 1. All or nothing: the numbers are checked before the first
-- write (a TTL PEXPIRE refuses must not leave a job behind with a record that never expires).
local prefix, keep, due, run_at, expires, key = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
-- A whole number of milliseconds in [low, 1e14] (1e14 ms: some 3,000 years), or nil.
local function ms(value, low)
  local n = tonumber(value)
  if n and n == n and n >= low and n <= 1e14 and n % 1 == 0 then
    return n
  end
  return nil
end
if not ms(keep, 1) or not ms(due, 0) or (#ARGV - 6) % 4 ~= 0 then
  return redis.error_reply('ERR aqw enqueue: bad record ttl, due time or job count; nothing written')
end
-- The record's fields but its task and enqueue time, the same for every job of the call.
local fields = {'state', run_at ~= '' and 'delayed' or 'queued', 'attempts', '0'}
if run_at ~= '' then
  fields[#fields + 1], fields[#fields + 2] = 'run_at', run_at
end
if expires ~= '' then
  fields[#fields + 1], fields[#fields + 2] = 'expires_at', expires
end
if key ~= '' then
  fields[#fields + 1], fields[#fields + 2] = 'key', key
end
local n = #fields / 2 + 2
-- A fresh record is one HSET: HSET answers how many fields it added, so a record that was
-- already there (the same job published again) is told apart without a read, and only then
-- written again from nothing.
local function write(rec, a)
  return redis.call('HSET', rec, 'task', ARGV[a + 2], 'enqueued_at', ARGV[a + 3],
    unpack(fields))
end
local out = {}
for a = 7, #ARGV, 4 do
  local rec = prefix .. 'job:' .. ARGV[a + 1]
  if due ~= '0' then
    redis.call('ZADD', KEYS[2], due, ARGV[a])
  else
    redis.call('XADD', KEYS[1], '*', 'j', ARGV[a])
  end
  local ok, added = pcall(write, rec, a)
  if not ok or added < n then  -- an earlier record (or a damaged key): replace it
    redis.call('DEL', rec)
    write(rec, a)
  end
  redis.call('PEXPIRE', rec, keep)
  out[#out + 1] = 1
end
return out
