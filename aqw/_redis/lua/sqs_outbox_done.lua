-- The outbox entries sent to SQS (sqs_outbox_take.lua) leave it; with no id left to
-- delete, the sender's lock is released.
-- KEYS[1] the outbox stream, KEYS[2] its lock
-- ARGV[1] the sender's token, then the entry ids sent
-- Returns the outbox's length after.
if #ARGV > 1 then
  redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
end
local left = redis.call('XLEN', KEYS[1])
if left == 0 and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
return left
