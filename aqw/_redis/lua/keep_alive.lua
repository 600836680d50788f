-- Refresh a pending stream entry's idle time, only while this consumer still owns it,
-- so that crash recovery (reclaim.lua) leaves a live holder's entry alone.
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer, ARGV[3] entry id.
-- Returns 1 when refreshed, 0 when the entry is no longer ours (acked or claimed by another).
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
