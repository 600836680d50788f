-- Give an unfinished job back for immediate redelivery (graceful shutdown, or a job that was
-- cancelled before it could finish): append a fresh copy, acknowledge and delete the old entry,
-- release the lease. Does nothing when this consumer no longer owns the entry. The job's
-- record (aqw/record.py), when it reads running, reads queued again (living the given ttl),
-- and leaves the running index, in the same step.
-- KEYS[1] stream, KEYS[2] lease key, KEYS[3] job record, KEYS[4] running index
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease token ('' for none), ARGV[4] entry id,
-- ARGV[5] job id ('' when unknown: no record is touched), ARGV[6] record ttl in ms
-- Returns the new entry id, or false when the entry was not ours to give back.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[4], ARGV[4], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
  return false
end
local entry = redis.call('XRANGE', KEYS[1], ARGV[4], ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[4])
if #entry == 0 then
  return false
end
local id = redis.call('XADD', KEYS[1], '*', unpack(entry[1][2]))
redis.call('XDEL', KEYS[1], ARGV[4])
if redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('DEL', KEYS[2])
end
if ARGV[5] ~= '' then
  if redis.pcall('HGET', KEYS[3], 'state') == 'running' then
    redis.call('HSET', KEYS[3], 'state', 'queued')
    redis.call('HDEL', KEYS[3], 'indexed')
    redis.call('PEXPIRE', KEYS[3], ARGV[6])
  end
  redis.call('ZREM', KEYS[4], ARGV[5])
end
return id
