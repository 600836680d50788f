-- Start jobs: take each job's lease and mark its record running, in one step, unless the job
-- was cancelled: before it started, or while an earlier attempt of it ran (its record has
-- cancel = 1: a reclaimed or handed back delivery of it does not run again). Then nothing is
-- touched. The leases share one fencing
-- counter (the queue's): SET key token NX PX ttl for each, and each lease taken gets the next
-- fencing token. A key this very token already holds (a retried call whose reply was lost) is
-- taken again, with a new token: fencing tokens only have to grow, not to be consecutive.
-- Mergeable (aqw/_redis/batch.py): jobs started at the same moment share one call.
--
-- The counter is checked first (as in lease_acquire_many.lua): if it is not a non-negative
-- integer, or handing out a token to every job asked for would pass 2^53 - 1
-- (9007199254740991), nothing is written and the reply is an error starting "AQWFENCE".
--
-- A record key holding another type than a hash (damaged) is left alone: the lease is taken.
-- KEYS[1] fencing counter, KEYS[2] running index (zset), then per job: lease key, record
-- ARGV[1] worker, ARGV[2] record ttl in ms, then per job (7): job id, lease token, lease ttl
--   in ms, attempt, now (seconds: its started_at; its lease expiry is now + the lease ttl),
--   task, enqueued_at
-- Returns one reply per job: its fencing token, 0 when its lease is held by another token,
-- -1 when the job was cancelled.
local limit = 9007199254740991
local n = (#KEYS - 2) / 2
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
local out = {}
for i = 0, n - 1 do
  local lease, rec = KEYS[3 + i * 2], KEYS[4 + i * 2]
  local a = 2 + i * 7
  local token, ttl = ARGV[a + 2], ARGV[a + 3]
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
        local expires = string.format('%.6f', tonumber(ARGV[a + 5]) + tonumber(ttl) / 1000)
        redis.call('HSET', rec, 'state', 'running', 'attempts', ARGV[a + 4],
          'started_at', ARGV[a + 5], 'worker', ARGV[1],
          'fencing_token', string.format('%d', fence), 'lease_expires_at', expires,
          'task', ARGV[a + 6], 'enqueued_at', ARGV[a + 7], 'progress', '', 'message', '',
          'run_at', '')
        redis.call('PEXPIRE', rec, ARGV[2])
        redis.call('ZADD', KEYS[2], ARGV[a + 5], ARGV[a + 1])
      end
      out[#out + 1] = fence
    else
      out[#out + 1] = 0
    end
  end
end
return out
