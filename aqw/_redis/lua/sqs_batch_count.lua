-- Count a child of a batch (or a flow's step) kept in a records= store for SQS, in the
-- worker's settle of the child, before its message is deleted: its result kept in the
-- store first (a flow's later step reads it as its input), then its final state counted in
-- each batch it names, once (batch_lib.lua: by leaving the todo set; a redelivered child
-- that counted already counts nothing). A count that completes a batch XADDs its callbacks
-- (and a flow's next steps) to the outbox stream, which the worker then sends to SQS.
-- KEYS[1] the outbox stream
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] the batches it counts in (space-separated ids),
--   ARGV[3] the child's job id, ARGV[4] its final state, ARGV[5] its result JSON ('' none),
--   ARGV[6] ms its result is kept
-- Returns the outbox's length after the count.
--@include batch_lib
local prefix, member = ARGV[1], ARGV[3]
if ARGV[5] ~= '' then
  local rec = prefix .. 'job:' .. member
  redis.call('HSET', rec, 'result', ARGV[5])
  redis.call('PEXPIRE', rec, ARGV[6])
end
batch_settled(prefix, ARGV[2], member, ARGV[4])
return redis.call('XLEN', KEYS[1])
