-- Enqueue children of an open batch: each job's XADD, its record (as enqueue.lua writes it,
-- with the batches it counts in in its 'batch' field: what the settle steps count it by) and
-- its membership in the batch's todo set and children list (a member known ahead, a flow's
-- step, is not added twice), in one step.
-- KEYS[1] the batch's hash
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] batch id, ARGV[3] record ttl ms (unfinished),
--   then per job (6): job JSON, job id, task, enqueued_at, stream key, the batches it
--   counts in (space-separated ids)
-- Returns the count of new members, or an error (nothing written) when the batch is not open.
local prefix, bid, keep = ARGV[1], ARGV[2], ARGV[3]
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'open' then
  return redis.error_reply('ERR aqw batch ' .. bid .. ' is ' .. (state or 'unknown')
    .. ': no child can be added to it')
end
local todo, children = KEYS[1] .. ':todo', KEYS[1] .. ':children'
local n = 0
for a = 4, #ARGV, 6 do
  local job = ARGV[a + 1]
  local rec = prefix .. 'job:' .. job
  redis.call('XADD', ARGV[a + 4], '*', 'j', ARGV[a])
  redis.call('DEL', rec)
  redis.call('HSET', rec, 'state', 'queued', 'task', ARGV[a + 2], 'attempts', '0',
    'enqueued_at', ARGV[a + 3], 'batch', ARGV[a + 5])
  redis.call('PEXPIRE', rec, keep)
  if redis.call('SADD', todo, job) == 1 then
    redis.call('RPUSH', children, job)
    n = n + 1
  end
end
redis.call('HINCRBY', KEYS[1], 'total', n)
redis.call('PEXPIRE', todo, keep)
redis.call('PEXPIRE', children, keep)
return n
