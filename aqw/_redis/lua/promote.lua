-- Move due jobs from the delayed set to the stream. Atomic, so any number of workers may run it
-- at once and a job is moved exactly once.
-- KEYS[1] delayed zset, KEYS[2] stream
-- ARGV[1] now (ms since the epoch), ARGV[2] most jobs to move
-- Returns {moved count, due time of the next job in ms or -1}.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, job in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'j', job)
  redis.call('ZREM', KEYS[1], job)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_due = -1
if #nxt > 0 then
  next_due = tonumber(nxt[2])
end
return {#due, next_due}
