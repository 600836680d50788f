-- Move a job to the dead-letter stream, acknowledge and delete its entry and release its lease
-- in one step. The DLQ is capped: past ARGV[4] entries the oldest are trimmed and counted.
-- KEYS[1] stream, KEYS[2] dlq stream, KEYS[3] lease key, KEYS[4] stats hash
-- ARGV[1] group, ARGV[2] lease token ('' for none), ARGV[3] entry id ('' when not from the stream),
-- ARGV[4] DLQ size limit, ARGV[5] consumer, ARGV[6..] field/value pairs of the DLQ entry
-- Returns the DLQ entry id, or false when refused (another holder owns the lease, or the lease
-- key is absent and the entry is no longer pending to this consumer: another claimed it).
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
local fields = {}
for i = 6, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id = redis.call('XADD', KEYS[2], '*', unpack(fields))
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
return id
