-- Acquire a lease: SET key token NX PX ttl, and on success hand out the next fencing token.
-- KEYS[1] lease key, KEYS[2] fencing counter
-- ARGV[1] token, ARGV[2] ttl in ms
-- Returns the fencing token (a strictly increasing integer), or false when the key is held.
-- A key already held by this very token (a retried acquire whose first reply was lost) is
-- taken again, with a new token: fencing tokens only have to grow, not to be consecutive.
--
-- The counter is checked first: if it is not a non-negative integer, or the next token would
-- pass 2^53 - 1 (9007199254740991, the last integer Lua's doubles hold exactly), nothing is
-- written and the reply is an error starting "AQWFENCE". The counter is never reset here:
-- fencing tokens must only grow, so an operator SETs it higher to resume.
local limit = 9007199254740991
local value = redis.pcall('GET', KEYS[2])
local damage = nil
if type(value) == 'table' then
  damage = 'not a string (' .. tostring(value.err) .. ')'
elseif value then
  local ok = value == '0' or (#value <= 16 and string.match(value, '^[1-9]%d*$') ~= nil)
  if not ok or tonumber(value) + 1 > limit then
    damage = "'" .. string.sub(value, 1, 40) .. "'"
  end
end
if damage then
  local shown = string.gsub(KEYS[2] .. ' is damaged or exhausted: ' .. damage, '[%c\128-\255]', '?')
  return redis.error_reply('AQWFENCE fencing counter ' .. shown)
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return redis.call('INCR', KEYS[2])
end
return false
