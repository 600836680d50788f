-- A periodic task's schedule mark, moved only forward (the schedule marks of a queue).
-- KEYS[1] the marks hash (aqw:{q}:schedule); ARGV[1] the task, ARGV[2] its tick, ARGV[3]
-- the encoded mark ("<tick> <job id>"). Writes the mark unless a later tick is recorded;
-- 1 when written, 0 when not.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local tick = tonumber(string.match(current, '^%S+'))
  if tick and tick > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
