-- Enqueue jobs and write their records in one step: per job, XADD it to the stream (or ZADD
-- it to the delayed set when it is due later) and replace its record (aqw/record.py) with a
-- fresh one: queued (delayed when run_at is given), its task, runs so far, times and key,
-- living for the given ttl (UNFINISHED_KEEP past its due time).
-- Mergeable (aqw/_redis/batch.py): concurrent single enqueues share one call.
-- KEYS[1] stream, KEYS[2] delayed zset, then per job: its record
-- ARGV per job (9): job JSON, due time in ms (0: now, into the stream), run_at (seconds;
--   '' unless due later), task, attempts, enqueued_at, expires_at ('' none), key ('' none),
--   record ttl in ms
-- Returns one reply per job: 1.
local out = {}
for i = 3, #KEYS do
  local a = (i - 3) * 9
  local rec, run_at = KEYS[i], ARGV[a + 3]
  if ARGV[a + 2] ~= '0' then
    redis.call('ZADD', KEYS[2], ARGV[a + 2], ARGV[a + 1])
  else
    redis.call('XADD', KEYS[1], '*', 'j', ARGV[a + 1])
  end
  redis.call('DEL', rec)
  if run_at ~= '' then
    redis.call('HSET', rec, 'state', 'delayed', 'run_at', run_at, 'task', ARGV[a + 4],
      'attempts', ARGV[a + 5], 'enqueued_at', ARGV[a + 6], 'expires_at', ARGV[a + 7],
      'key', ARGV[a + 8])
  else
    redis.call('HSET', rec, 'state', 'queued', 'task', ARGV[a + 4], 'attempts', ARGV[a + 5],
      'enqueued_at', ARGV[a + 6], 'expires_at', ARGV[a + 7], 'key', ARGV[a + 8])
  end
  redis.call('PEXPIRE', rec, ARGV[a + 9])
  out[#out + 1] = 1
end
return out
