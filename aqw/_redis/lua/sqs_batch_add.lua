-- Make jobs children of an open batch kept in a records= store for SQS (the jobs themselves
-- are sent to SQS after this step; sqs_batch_drop.lua takes back those whose send failed):
-- each one's membership in the batch's todo set and children list (a member known ahead,
-- a flow's step, is not added twice), in one step.
-- KEYS[1] the batch's hash
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] batch id, ARGV[3] ms an unfinished batch lives,
--   then the job ids
-- Returns the count of new members, or an error (nothing written) when the batch is not open.
--@include batch_lib
local bid, keep = ARGV[2], ARGV[3]
local closed = batch_closed(KEYS[1], bid)
if closed then
  return closed
end
local n = 0
for a = 4, #ARGV do
  n = n + batch_join(KEYS[1], ARGV[a])
end
batch_joined(KEYS[1], n, keep)
return n
