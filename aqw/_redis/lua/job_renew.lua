-- Renew a job's lease only while it is still ours (compare the token, then PEXPIRE), and in
-- the same step move its record's lease expiry on while the record reads running under the
-- lease's fencing token (as job_progress.lua does, TTL refresh included), and keep the
-- per-key cap sets the job holds a slot in (job_start.lua) alive at least as long as the lease.
-- KEYS[1] lease key, KEYS[2] job record, KEYS[3..] the job's cap sets (`slots:<key>`)
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] fencing token, ARGV[4] new lease expiry
-- (seconds), ARGV[5] record ttl in ms
-- Returns 1 when renewed, 0 when the lease is not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
for i = 3, #KEYS do
  local left = redis.call('PTTL', KEYS[i])
  if left ~= -2 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  end
end
local cur = redis.pcall('HMGET', KEYS[2], 'state', 'fencing_token')
if not cur.err and cur[1] == 'running' and cur[2] == ARGV[3] then
  redis.call('HSET', KEYS[2], 'lease_expires_at', ARGV[4])
  local keep = tonumber(ARGV[5])
  if redis.call('PTTL', KEYS[2]) < keep / 2 then
    redis.call('PEXPIRE', KEYS[2], keep)
  end
end
return 1
