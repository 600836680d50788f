-- Make jobs children of an open batch kept in a records= store for SQS (the jobs themselves
-- are sent to SQS after this step; sqs_batch_drop.lua takes back those whose send failed):
-- each one's membership in the batch's todo set and children list (a member known ahead,
-- a flow's step, is not added twice), in one step.
-- KEYS[1] the batch's hash
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] batch id, ARGV[3] ms an unfinished batch lives,
--   then the job ids
-- Returns the count of new members, or an error (nothing written) when the batch is not open.
local bid, keep = ARGV[2], ARGV[3]
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'open' then
  return redis.error_reply('ERR aqw batch ' .. bid .. ' is ' .. (state or 'unknown')
    .. ': no child can be added to it')
end
local todo, children = KEYS[1] .. ':todo', KEYS[1] .. ':children'
local n = 0
for a = 4, #ARGV do
  if redis.call('SADD', todo, ARGV[a]) == 1 then
    redis.call('RPUSH', children, ARGV[a])
    n = n + 1
  end
end
redis.call('HINCRBY', KEYS[1], 'total', n)
redis.call('PEXPIRE', todo, keep)
redis.call('PEXPIRE', children, keep)
return n
