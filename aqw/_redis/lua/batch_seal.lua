-- Seal a batch (no child can be added from now on) or, with ARGV[3] = '1', cancel it: its
-- unfinished children are stopped (batch_lib.lua's batch_stop) and it is sealed. A sealed
-- batch with no unfinished child completes in this step (its callbacks enqueued).
-- KEYS[1] the batch's hash
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] batch id, ARGV[3] '1' to cancel
-- Returns 1, or 0 for an unknown batch.
--@include batch_lib
local prefix, bid = ARGV[1], ARGV[2]
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return 0
end
if state == 'open' then
  redis.call('HSET', KEYS[1], 'state', 'sealed')
  state = 'sealed'
end
if ARGV[3] == '1' then
  batch_stop(prefix, bid)
end
if state == 'sealed' and redis.call('SCARD', KEYS[1] .. ':todo') == 0 then
  batch_fire(prefix, bid)
end
return 1
