-- Record a queue's depth once per bucket, whatever the number of workers calling: a member
-- "<bucket> <waiting> <in flight> <delayed> <dead>" scored by the bucket's start, added only
-- when the bucket has none; samples older than the kept window are trimmed, and the key
-- expires when no worker beats any more. O(log N) per call; N is bounded by the window.
-- KEYS[1] depth zset, KEYS[2] dlq stream, then per priority level in use (2): its stream,
--   its delayed zset (level 0's first)
-- ARGV[1] bucket start (s), ARGV[2] seconds kept, ARGV[3] consumer group, then the counters of
--   the jobs waiting in the fair shares of the levels that hold them (fair_enqueue.lua's
--   aqw:{q}:fair[:pN]:n, in the queue's slot), counted as waiting
-- Returns 1 when a sample was added, 0 when the bucket had one.
local bucket = tonumber(ARGV[1])
if redis.call('ZCOUNT', KEYS[1], bucket, bucket) > 0 then
  return 0
end
local waiting, in_flight, delayed = 0, 0, 0
for i = 3, #KEYS, 2 do
  local length = redis.call('XLEN', KEYS[i])
  local pending_here = 0
  if length > 0 then
    local ok, pending = pcall(redis.call, 'XPENDING', KEYS[i], ARGV[3])
    if ok and type(pending) == 'table' then
      pending_here = tonumber(pending[1]) or 0
    end
  end
  in_flight = in_flight + pending_here
  waiting = waiting + math.max(0, length - pending_here)
  delayed = delayed + redis.call('ZCARD', KEYS[i + 1])
end
for a = 4, #ARGV do
  waiting = waiting + math.max(0, tonumber(redis.call('GET', ARGV[a])) or 0)
end
local dead = redis.call('XLEN', KEYS[2])
redis.call('ZADD', KEYS[1], bucket,
  string.format('%d %d %d %d %d', bucket, waiting, in_flight, delayed, dead))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (bucket - tonumber(ARGV[2])))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
