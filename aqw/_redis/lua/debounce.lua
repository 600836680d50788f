-- A debounced enqueue, in one step: while the key's job still waits in the delayed set,
-- replace it (its payload and headers, same id) and push its start back; once it has left
-- the set (promoted to the stream, started, retried) or was cancelled, start a new job. The
-- job is due at min(now + debounce, first + debounce_max), first being the burst's first
-- enqueue. The key's record (a hash: id, member, first) lives a slack past that due time;
-- the job's record (aqw/record.py) is written as enqueue.lua writes it (delayed, or queued
-- when the bound has already passed).
-- KEYS[1] the key's debounce record, KEYS[2] the delayed zset of the job's level
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] now (ms), ARGV[3] debounce (ms), ARGV[4]
--   debounce_max (ms, 0: none), ARGV[5] debounce record slack (ms), ARGV[6] job record ttl
--   past its due time (ms), ARGV[7] the new job's id, ARGV[8] the job's JSON up to its id,
--   ARGV[9] the job's JSON after its id, ARGV[10] task, ARGV[11] enqueued_at, ARGV[12]
--   expires_at ('' none), ARGV[13] key
-- Returns {the waiting job's id, 1 if an earlier waiting job was replaced else 0}.
-- All or nothing: the numbers are checked before the first write (the ZREM below).
local function ms(value, low)
  local n = tonumber(value)
  if n and n == n and n >= low and n <= 1e14 and n % 1 == 0 then
    return n
  end
  return nil
end
for i = 2, 6 do
  if not ms(ARGV[i], i == 4 and 0 or 1) then
    return redis.error_reply('ERR aqw debounce: bad time argument ' .. i .. '; nothing written')
  end
end
local final = {succeeded = true, failed = true, dead = true, cancelled = true, expired = true}
local prefix = ARGV[1]
local now = tonumber(ARGV[2])
local id, first, replaced = ARGV[7], now, 0
local held = redis.call('HMGET', KEYS[1], 'id', 'member', 'first')
if held[1] and held[2] then
  local state = redis.pcall('HGET', prefix .. 'job:' .. held[1], 'state')
  -- ZREM answers 1 only while the job is still waiting: the promotion and the start of a
  -- job take its member out of the set first.
  if not (type(state) == 'string' and final[state])
      and redis.call('ZREM', KEYS[2], held[2]) == 1 then
    id, first, replaced = held[1], tonumber(held[3]) or now, 1
  end
end
local due = now + tonumber(ARGV[3])
local most = tonumber(ARGV[4])
if most > 0 and first + most < due then
  due = first + most
end
local member = ARGV[8] .. id .. ARGV[9]
redis.call('ZADD', KEYS[2], due, member)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'id', id, 'member', member, 'first', string.format('%d', first))
local ahead = math.max(due - now, 0)
redis.call('PEXPIRE', KEYS[1], string.format('%d', ahead + tonumber(ARGV[5])))
local rec = prefix .. 'job:' .. id
redis.call('DEL', rec)
redis.call('HSET', rec, 'state', 'queued', 'task', ARGV[10], 'attempts', '0',
  'enqueued_at', ARGV[11], 'key', ARGV[13])
if due > now then
  redis.call('HSET', rec, 'state', 'delayed', 'run_at', string.format('%.3f', due / 1000))
end
if ARGV[12] ~= '' then
  redis.call('HSET', rec, 'expires_at', ARGV[12])
end
redis.call('PEXPIRE', rec, string.format('%d', ahead + tonumber(ARGV[6])))
return {id, replaced}
