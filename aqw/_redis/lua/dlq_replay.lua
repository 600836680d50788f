-- Put dead-lettered jobs back on the stream and remove them from the DLQ, in one step.
-- KEYS[1] dlq stream, KEYS[2] stream
-- ARGV[1..] pairs of (DLQ entry id, job JSON to enqueue)
-- Returns the number of jobs replayed (entries already gone are skipped).
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('XDEL', KEYS[1], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[2], '*', 'j', ARGV[i + 1])
    n = n + 1
  end
end
return n
