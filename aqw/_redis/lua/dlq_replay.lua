-- Put dead-lettered jobs back on the stream and remove them from the DLQ, in one step; each
-- replayed job's record (aqw/record.py) reads queued again (its story of runs, times and
-- last error kept; its end, DLQ entry and cancel request dropped), or is written afresh (as
-- enqueue.lua writes it) when it has expired, and lives the given ttl. A record key of another type than a hash is left
-- alone.
-- KEYS[1] dlq stream, KEYS[2] stream, then per job: its record
-- ARGV[1] record ttl in ms, then per job (7): DLQ entry id, job JSON to enqueue, task,
--   attempts, enqueued_at, expires_at ('' none), key ('' none)
-- Returns the number of jobs replayed (entries already gone are skipped).
local n = 0
for i = 3, #KEYS do
  local a = 1 + (i - 3) * 7
  local rec = KEYS[i]
  if redis.call('XDEL', KEYS[1], ARGV[a + 1]) == 1 then
    redis.call('XADD', KEYS[2], '*', 'j', ARGV[a + 2])
    n = n + 1
    local was = redis.pcall('HGET', rec, 'state')
    if was and type(was) ~= 'table' then
      redis.call('HDEL', rec, 'finished_at', 'dlq_entry', 'run_at', 'cancel')
      redis.call('HSET', rec, 'state', 'queued')
      redis.call('PEXPIRE', rec, ARGV[1])
    elseif not was then
      redis.call('DEL', rec)
      redis.call('HSET', rec, 'state', 'queued', 'task', ARGV[a + 3], 'attempts', ARGV[a + 4],
        'enqueued_at', ARGV[a + 5], 'expires_at', ARGV[a + 6], 'key', ARGV[a + 7])
      redis.call('PEXPIRE', rec, ARGV[1])
    end
  end
end
return n
