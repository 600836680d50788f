-- Enqueue children of an open batch: each job's XADD, its record (as enqueue.lua writes it,
-- with the batches it counts in in its 'batch' field: what the settle steps count it by) and
-- its membership in the batch's todo set and children list (a member known ahead, a flow's
-- step, is not added twice), in one step.
-- KEYS[1] the batch's hash
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] batch id, ARGV[3] record ttl ms (unfinished),
--   then per job (6): job JSON, job id, task, enqueued_at, stream key, the batches it
--   counts in (space-separated ids)
-- Returns the count of new members, or an error (nothing written) when the batch is not open.
--@include batch_lib
local prefix, bid, keep = ARGV[1], ARGV[2], ARGV[3]
local closed = batch_closed(KEYS[1], bid)
if closed then
  return closed
end
local n = 0
for a = 4, #ARGV, 6 do
  local job = ARGV[a + 1]
  local rec = prefix .. 'job:' .. job
  redis.call('XADD', ARGV[a + 4], '*', 'j', ARGV[a])
  redis.call('DEL', rec)
  redis.call('HSET', rec, 'state', 'queued', 'task', ARGV[a + 2], 'attempts', '0',
    'enqueued_at', ARGV[a + 3], 'batch', ARGV[a + 5])
  redis.call('PEXPIRE', rec, keep)
  n = n + batch_join(KEYS[1], job)
end
batch_joined(KEYS[1], n, keep)
return n
