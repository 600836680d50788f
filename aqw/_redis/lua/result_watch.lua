-- Wait for jobs to end, atomically with reading their state (aqw/_redis/waiters.py): a job
-- that has no record (or a record key of another type than a hash) cannot be waited for; one
-- that has ended need not be; otherwise the caller's inbox joins the job's waiters set (which
-- lives as long as the record), so the step that ends the job pushes its id to that inbox; the
-- record is marked (waited = 1) so that the steps that end jobs nobody waits for skip that.
-- Mergeable (aqw/_redis/batch.py): waits registered at the same moment share one call.
-- ARGV[1] inbox (a list key); KEYS per job: its record, its waiters set
-- Returns one reply per job: 0 no record, 1 ended, 2 waiting.
local final = {succeeded = true, failed = true, dead = true, cancelled = true, expired = true}
local out = {}
for i = 1, #KEYS, 2 do
  local state = redis.pcall('HGET', KEYS[i], 'state')
  if type(state) == 'table' or not state then
    out[#out + 1] = 0
  elseif final[state] then
    out[#out + 1] = 1
  else
    redis.pcall('SADD', KEYS[i + 1], ARGV[1])
    redis.call('HSET', KEYS[i], 'waited', '1')  -- the step that ends it looks for waiters
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl > 0 then
      redis.pcall('PEXPIRE', KEYS[i + 1], ttl)
    end
    out[#out + 1] = 2
  end
end
return out
