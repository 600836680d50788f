-- Settle a finished job: acknowledge and delete its entry (the stream only keeps unfinished
-- work, so it stays bounded), release its lease, count it. Refuses when another holder has
-- taken the lease: that holder now owns the job and settles it.
-- KEYS[1] stream, KEYS[2] lease key, KEYS[3] stats hash
-- ARGV[1] group, ARGV[2] lease token ('' for none), ARGV[3] entry id
-- Returns 1 when acknowledged, 0 when refused.
local cur = redis.call('GET', KEYS[2])
if cur and cur ~= ARGV[2] then
  return 0
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
if cur then
  redis.call('DEL', KEYS[2])
end
redis.call('HINCRBY', KEYS[3], 'processed', 1)
return 1
