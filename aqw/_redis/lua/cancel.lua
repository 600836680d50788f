-- Cancel a job by its record (aqw/record.py), in one step. A job that has not started
-- (queued, delayed, retrying) ends cancelled at once: its record says so (and lives at least
-- the given keep time), whoever waits for it is woken (as in ack.lua) and it is counted. Its stream
-- entry or delayed member stays: job_start.lua refuses it and the worker that fetches it
-- acknowledges it. A running job's record gets cancel = 1: its worker reads it at the next
-- lease renewal and stops the handler. A finished job is left alone.
-- KEYS[1] job record, KEYS[2] waiters set, KEYS[3] stats hash
-- ARGV[1] job id, ARGV[2] record ttl in ms, ARGV[3] now (seconds)
-- Returns 'cancelled', 'cancelling', 'finished', or 'unknown' (no record, or a record key of
-- another type than a hash).
local final = {succeeded = true, failed = true, dead = true, cancelled = true, expired = true}
local state = redis.pcall('HGET', KEYS[1], 'state')
if type(state) == 'table' or not state then
  return 'unknown'
end
if final[state] then
  return 'finished'
end
if state == 'running' then
  redis.call('HSET', KEYS[1], 'cancel', '1')
  return 'cancelling'
end
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'cancel', '1', 'finished_at', ARGV[3])
-- Its message may still wait in the queue: the record must outlive it, or the job would run
-- once the record is gone. It lives the keep time, or as long as it would have unfinished.
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local inboxes = redis.pcall('SMEMBERS', KEYS[2])
if not inboxes.err and #inboxes > 0 then
  for _, inbox in ipairs(inboxes) do
    redis.pcall('RPUSH', inbox, ARGV[1])
    redis.pcall('PEXPIRE', inbox, 300000)
  end
  redis.call('DEL', KEYS[2])
end
redis.call('HINCRBY', KEYS[3], 'cancelled', 1)
return 'cancelled'
