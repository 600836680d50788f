-- Enqueue jobs that have a fairness key (aqw/brokers/redis/_fair.py), and write their
-- records, in one step. A fair job does not go to its level's stream: it waits in its key's
-- list until a fetch picks it (fair_fetch.lua). Per level (suffix '' for 0, ':pN' else),
-- in the queue's slot, under the prefix aqw:{q}:fair<suffix>:
--   active  ZSET key -> start tag of the key's next job (the keys with jobs waiting)
--   idle    ZSET key -> finish tag of a key that ran dry (so it cannot cut in by leaving
--           and coming back); tags at or below the clock are pruned
--   w       HASH key -> weight (of the active keys)
--   clock   the start tag of the last job picked (start-time fair queueing's virtual time)
--   n       jobs waiting in all the level's key lists
--   q:<key> LIST of the key's waiting jobs, oldest first
-- A key that becomes active starts at max(clock, its idle finish tag): never behind the
-- keys already waiting, so its first job is among the next (active keys) picks.
-- KEYS[1] the levels set (gets 'f<level>': workers learn the level holds fair jobs),
--   KEYS[2] the level's active zset
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] level, ARGV[3] record ttl in ms, ARGV[4]
--   expires_at ('' none), then per job (6): job JSON, job id, task, enqueued_at, fairness
--   key, weight
-- Returns the number of jobs enqueued. All or nothing: the arguments are checked first.
local prefix, level, keep, expires = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if not keep or keep ~= keep or keep < 1 or keep > 1e14 or keep % 1 ~= 0
    or (#ARGV - 4) % 6 ~= 0 or not string.match(level, '^[0-9]$') then
  return redis.error_reply('ERR aqw fair enqueue: bad record ttl, level or job count; nothing written')
end
for a = 5, #ARGV, 6 do
  local w = tonumber(ARGV[a + 5])
  if not w or w ~= w or w <= 0 or w > 1e6 then
    return redis.error_reply('ERR aqw fair enqueue: bad weight; nothing written')
  end
end
local base = prefix .. 'fair' .. (level == '0' and '' or ':p' .. level) .. ':'
local active, idle, weights = KEYS[2], base .. 'idle', base .. 'w'
local clock = nil
for a = 5, #ARGV, 6 do
  local key = ARGV[a + 4]
  redis.call('RPUSH', base .. 'q:' .. key, ARGV[a])
  redis.call('HSET', weights, key, ARGV[a + 5])
  if not redis.call('ZSCORE', active, key) then
    clock = clock or tonumber(redis.call('GET', base .. 'clock')) or 0
    local start = tonumber(redis.call('ZSCORE', idle, key))
    if not start or start < clock then
      start = clock
    end
    redis.call('ZADD', active, string.format('%.17g', start), key)
    redis.call('ZREM', idle, key)
  end
  local rec = prefix .. 'job:' .. ARGV[a + 1]
  redis.call('DEL', rec)
  redis.call('HSET', rec, 'state', 'queued', 'task', ARGV[a + 2], 'attempts', '0',
    'enqueued_at', ARGV[a + 3])
  if expires ~= '' then
    redis.call('HSET', rec, 'expires_at', expires)
  end
  redis.call('PEXPIRE', rec, keep)
end
local count = (#ARGV - 4) / 6
redis.call('INCRBY', base .. 'n', count)
redis.call('SADD', KEYS[1], 'f' .. level)
return count
