-- Take the outbox of a records= store for SQS (the jobs the batch counts enqueued: the
-- callbacks and a flow's next steps) for sending: the sender's token holds a short lock,
-- so two workers do not send the same entries at once. An empty outbox takes no lock (and
-- drops the sender's own): a process that found nothing to send must not hold back
-- another's send for the lock's life.
-- KEYS[1] the outbox stream, KEYS[2] its lock
-- ARGV[1] the sender's token, ARGV[2] the lock's ms, ARGV[3] most entries
-- Returns the entries (id, fields) when the lock is the sender's, else an empty list.
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then
  return {}
end
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[3])
if #entries == 0 then
  if holder then
    redis.call('DEL', KEYS[2])
  end
  return entries
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return entries
