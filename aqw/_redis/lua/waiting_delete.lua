-- Delete one waiting stream entry that no consumer has taken (the dashboard, aqw queue).
-- KEYS[1] the level's stream
-- ARGV[1] entry id, ARGV[2] consumer group
-- Returns 1 (deleted), 0 (no such entry), -1 (taken by a consumer: not deleted).
local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1], 'COUNT', 1)
if #found == 0 then
  return 0
end
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[2], ARGV[1], ARGV[1], 1)
if type(pending) == 'table' and pending.err == nil and #pending > 0 then
  return -1
end
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
