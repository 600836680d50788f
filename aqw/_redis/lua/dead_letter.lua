-- Move a job to the dead-letter stream, acknowledge and delete its entry and release its lease
-- in one step. The DLQ is capped: past ARGV[4] entries the oldest are trimmed and counted.
-- The job's record (aqw/record.py) reads dead in the same step (its end, last error and the
-- new DLQ entry's id in dlq_entry), lives the given keep time, leaves the running index, and
-- whoever waits for it is woken (as in ack.lua). No record is written for a message that
-- did not decode (no job id), nor into a record key of another type than a hash.
-- KEYS[1] stream, KEYS[2] dlq stream, KEYS[3] lease key, KEYS[4] stats hash, KEYS[5] job
--   record, KEYS[6] waiters set, KEYS[7] running index
-- ARGV[1] group, ARGV[2] lease token ('' for none), ARGV[3] entry id ('' when not from the stream),
-- ARGV[4] DLQ size limit, ARGV[5] consumer, ARGV[6] job id ('' for none), ARGV[7] record ttl
-- in ms, ARGV[8] count n of the record's field/value values, ARGV[9 .. 8 + n] those values,
-- ARGV[9 + n ..] field/value pairs of the DLQ entry
-- Returns the DLQ entry id, or false when refused (another holder owns the lease, or the lease
-- key is absent and the entry is no longer pending to this consumer: another claimed it).
-- Batches: a child's record names its batch ('batch', read with its state: no command more for
-- a job of no batch); it is counted there once as failed (batch_lib.lua), in this step.
--@include batch_lib
local cur = redis.call('GET', KEYS[3])
if cur and cur ~= ARGV[2] then
  return false
end
if not cur and ARGV[3] ~= '' then
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
  if #p == 0 or p[1][2] ~= ARGV[5] then
    return false
  end
end
-- No longer pending: another holder settled it after this one's lease expired.
if ARGV[3] ~= '' and redis.call('XACK', KEYS[1], ARGV[1], ARGV[3]) == 0 then
  return false
end
local n = tonumber(ARGV[8])
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 9 + n))
if ARGV[3] ~= '' then
  redis.call('XDEL', KEYS[1], ARGV[3])
end
if cur then
  redis.call('DEL', KEYS[3])
end
redis.call('HINCRBY', KEYS[4], 'dead', 1)
local limit = tonumber(ARGV[4])
if limit > 0 and redis.call('XLEN', KEYS[2]) > limit then
  local trimmed = redis.call('XTRIM', KEYS[2], 'MAXLEN', limit)
  redis.call('HINCRBY', KEYS[4], 'dlq_trimmed', trimmed)
end
local job = ARGV[6]
if job ~= '' then
  local was = redis.pcall('HMGET', KEYS[5], 'state', 'batch')
  if not was.err then
    redis.call('HSET', KEYS[5], 'state', 'dead', 'dlq_entry', id, unpack(ARGV, 9, 8 + n))
    redis.call('PEXPIRE', KEYS[5], ARGV[7])
    local inboxes = redis.pcall('SMEMBERS', KEYS[6])
    if not inboxes.err and #inboxes > 0 then
      for _, inbox in ipairs(inboxes) do
        redis.pcall('RPUSH', inbox, job)
        redis.pcall('PEXPIRE', inbox, 300000)
      end
      redis.call('DEL', KEYS[6])
    end
    if was[2] then  -- a batch's child: its record key is <prefix>job:<id>
      -- protected: damage in a batch's keys never fails the settle of its child
      pcall(batch_settled, string.sub(KEYS[5], 1, #KEYS[5] - #job - 4), was[2], job, 'dead')
    end
  end
  redis.call('ZREM', KEYS[7], job)
end
return id
