-- One job due now and its fresh record (aqw/record.py): the lean form of enqueue.lua for a
-- lone enqueue without an idempotency key, fewer arguments for the common job. XADD it to
-- its level's stream and write its record: queued, its task, enqueue time and expires_at
-- when it has one, living for the given ttl.
-- KEYS[1] the stream of the job's level, KEYS[2] the job's record (aqw:{q}:job:<id>)
-- ARGV[1] job JSON, ARGV[2] task, ARGV[3] enqueued_at, ARGV[4] record ttl in ms,
--   ARGV[5] expires_at (absent: none)
-- Returns 1. All or nothing: the record ttl is checked before the first write.
local keep = tonumber(ARGV[4])
if not keep or keep ~= keep or keep < 1 or keep > 1e14 or keep % 1 ~= 0 then
  return redis.error_reply('ERR aqw enqueue: bad record ttl; nothing written')
end
redis.call('XADD', KEYS[1], '*', 'j', ARGV[1])
-- A fresh record takes one HSET: HSET answers how many fields it added, so a record that was
-- already there (the same job published again) is told apart without a read, and only then
-- written again from nothing.
local function write()
  if ARGV[5] then
    return redis.call('HSET', KEYS[2], 'state', 'queued', 'task', ARGV[2], 'attempts', '0',
      'enqueued_at', ARGV[3], 'expires_at', ARGV[5])
  end
  return redis.call('HSET', KEYS[2], 'state', 'queued', 'task', ARGV[2], 'attempts', '0',
    'enqueued_at', ARGV[3])
end
local ok, added = pcall(write)
if not ok or added < (ARGV[5] and 5 or 4) then  -- an earlier record (or a damaged key)
  redis.call('DEL', KEYS[2])
  write()
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
