-- Start jobs: take each job's lease and mark its record running, in one step, unless the job
-- was cancelled: before it started, or while an earlier attempt of it ran (its record has
-- cancel = 1: a reclaimed or handed back delivery of it does not run again). Then nothing is
-- touched. The leases share one fencing counter (the queue's): SET key token NX PX ttl for
-- each, and each lease taken gets the next fencing token. A key this very token already holds
-- (a retried call whose reply was lost) is taken again, with a new token: fencing tokens only
-- have to grow, not to be consecutive.
-- Mergeable (aqw/_redis/batch.py): jobs started at the same moment share one call, so the
-- per-job part is as small as it can be: the keys are built here from the queue's prefix
-- (all in the queue's slot) and the time is the server's.
--
-- The counter is checked first (as in lease_acquire_many.lua): if it is not a non-negative
-- integer, or handing out a token to every job asked for would pass 2^53 - 1
-- (9007199254740991), nothing is written and the reply is an error starting "AQWFENCE".
--
-- A record key holding another type than a hash (damaged) is left alone: the lease is taken.
-- The running index (the list `aqw status` reads) is not written here: a job enters it once
-- it has run a while (job_progress.lua), so short jobs cost nothing there.
-- KEYS[1] fencing counter
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] worker, ARGV[3] record ttl in ms, ARGV[4] lease ttl
--   in ms, then per job (3): job id, lease token, attempt
-- Returns one reply per job: its fencing token, 0 when its lease is held by another token,
-- -1 when the job was cancelled.
local limit = 9007199254740991
local n = (#ARGV - 4) / 3
local value = redis.pcall('GET', KEYS[1])
local damage = nil
if type(value) == 'table' then
  damage = 'not a string (' .. tostring(value.err) .. ')'
elseif value then
  local ok = value == '0' or (#value <= 16 and string.match(value, '^[1-9]%d*$') ~= nil)
  if not ok or tonumber(value) + n > limit then
    damage = "'" .. string.sub(value, 1, 40) .. "'"
  end
end
if damage then
  local shown = string.gsub(KEYS[1] .. ' is damaged or exhausted: ' .. damage, '[%c\128-\255]', '?')
  return redis.error_reply('AQWFENCE fencing counter ' .. shown)
end
local prefix, worker, keep, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local started = string.format('%.6f', now)
local expires = string.format('%.6f', now + tonumber(ttl) / 1000)
local out = {}
for a = 5, #ARGV, 3 do
  local job, token = ARGV[a], ARGV[a + 1]
  local lease, rec = prefix .. 'lease:' .. job, prefix .. 'job:' .. job
  local cur = redis.pcall('HMGET', rec, 'state', 'cancel')
  local damaged = cur.err ~= nil
  if not damaged and (cur[1] == 'cancelled' or cur[2] == '1') then
    out[#out + 1] = -1
  else
    local took = redis.call('SET', lease, token, 'NX', 'PX', ttl)
    if not took and redis.call('GET', lease) == token then
      redis.call('PEXPIRE', lease, ttl)
      took = true
    end
    if took then
      local fence = redis.call('INCR', KEYS[1])
      if not damaged then
        redis.call('HSET', rec, 'state', 'running', 'attempts', ARGV[a + 2],
          'started_at', started, 'worker', worker, 'fencing_token', fence,
          'lease_expires_at', expires)
        redis.call('HDEL', rec, 'progress', 'message', 'run_at')  -- of an earlier wait or run
        redis.call('PEXPIRE', rec, keep)
      end
      out[#out + 1] = fence
    else
      out[#out + 1] = 0
    end
  end
end
return out
