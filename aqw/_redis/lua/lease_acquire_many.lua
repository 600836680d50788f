-- Acquire several leases that share one fencing counter (the job leases of one queue):
-- SET key token NX PX ttl for each, and hand each lease taken the next fencing token.
-- KEYS[1] fencing counter, KEYS[2..] lease keys
-- ARGV per lease: token, ttl in ms
-- Returns one reply per lease: its fencing token, or 0 when the key is held (by another
-- token: a key this token already holds, from a retried call, is taken again).
--
-- The counter is checked first (as in lease_acquire.lua): if it is not a non-negative
-- integer, or handing out a token to every lease asked for would pass 2^53 - 1
-- (9007199254740991), nothing is written and the reply is an error starting "AQWFENCE".
local limit = 9007199254740991
local value = redis.pcall('GET', KEYS[1])
local damage = nil
if type(value) == 'table' then
  damage = 'not a string (' .. tostring(value.err) .. ')'
elseif value then
  local ok = value == '0' or (#value <= 16 and string.match(value, '^[1-9]%d*$') ~= nil)
  if not ok or tonumber(value) + (#KEYS - 1) > limit then
    damage = "'" .. string.sub(value, 1, 40) .. "'"
  end
end
if damage then
  local shown = string.gsub(KEYS[1] .. ' is damaged or exhausted: ' .. damage, '[%c\128-\255]', '?')
  return redis.error_reply('AQWFENCE fencing counter ' .. shown)
end
local out = {}
for i = 2, #KEYS do
  local a = (i - 2) * 2 + 1
  if redis.call('SET', KEYS[i], ARGV[a], 'NX', 'PX', ARGV[a + 1]) then
    out[#out + 1] = redis.call('INCR', KEYS[1])
  elseif redis.call('GET', KEYS[i]) == ARGV[a] then
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 1])
    out[#out + 1] = redis.call('INCR', KEYS[1])
  else
    out[#out + 1] = 0
  end
end
return out
