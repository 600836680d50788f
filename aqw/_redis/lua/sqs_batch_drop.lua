-- Take back children whose send to SQS failed (added by sqs_batch_add.lua): those still
-- unfinished leave the todo set and the children list, and the total, in one step.
-- KEYS[1] the batch's hash
-- ARGV[1] the job ids
-- Returns the count taken back.
local todo, children = KEYS[1] .. ':todo', KEYS[1] .. ':children'
local n = 0
for _, job in ipairs(ARGV) do
  if redis.call('SREM', todo, job) == 1 then
    redis.call('LREM', children, -1, job)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[1], 'total', -n)
end
return n
