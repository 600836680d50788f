-- Open a batch (batch_lib.lua has its keys): state open (or sealed, for a flow step's gate),
-- its options, its members known ahead (a flow's steps, a gate's parents) and its callbacks'
-- jobs; with a parent, the new batch is added to that open batch as its child batch:<id>.
-- KEYS[1] the batch's hash
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] batch id, ARGV[3] fail_fast ('1' or '0'),
--   ARGV[4] keep ms once complete, ARGV[5] the callbacks' key ttl ms, ARGV[6] parent id ('' none),
--   ARGV[7] ms an unfinished batch lives, ARGV[8] '1': opened sealed, ARGV[9] a gate's parents'
--   step names ('' none), ARGV[10] data ('' none), ARGV[11] count m of members, then m member
--   ids, then per callback (7): kind, job JSON, job id, task, stream key, enqueued_at, the
--   batches the job counts in ('' none)
-- Returns 1, or an error (nothing written) when the batch exists or the parent is not open.
local prefix, bid, parent = ARGV[1], ARGV[2], ARGV[6]
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('ERR aqw batch ' .. bid .. ' exists already')
end
if parent ~= '' then
  local p = prefix .. 'batch:' .. parent
  local state = redis.call('HGET', p, 'state')
  if state ~= 'open' then
    return redis.error_reply('ERR aqw batch ' .. parent .. ' is ' .. (state or 'unknown')
      .. ': no child can be added to it')
  end
  redis.call('SADD', p .. ':todo', 'batch:' .. bid)
  redis.call('RPUSH', p .. ':children', 'batch:' .. bid)
  redis.call('HINCRBY', p, 'total', 1)
end
local m = tonumber(ARGV[11])
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'state', ARGV[8] == '1' and 'sealed' or 'open', 'total', m,
  'fail_fast', ARGV[3], 'keep', ARGV[4], 'key_ttl', ARGV[5], 'created_at',
  string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1e6))
for i, field in ipairs({'parent', 'inputs', 'data'}) do
  local value = ARGV[({6, 9, 10})[i]]
  if value ~= '' then
    redis.call('HSET', KEYS[1], field, value)
  end
end
if m > 0 then
  redis.call('SADD', KEYS[1] .. ':todo', unpack(ARGV, 12, 11 + m))
  redis.call('RPUSH', KEYS[1] .. ':children', unpack(ARGV, 12, 11 + m))
  redis.call('PEXPIRE', KEYS[1] .. ':todo', ARGV[7])
  redis.call('PEXPIRE', KEYS[1] .. ':children', ARGV[7])
end
for a = 12 + m, #ARGV, 7 do
  local kind = ARGV[a]
  redis.call('HSET', KEYS[1], 'cb:' .. kind, ARGV[a + 1], 'cbid:' .. kind, ARGV[a + 2],
    'cbtask:' .. kind, ARGV[a + 3], 'cbstream:' .. kind, ARGV[a + 4], 'cbat:' .. kind, ARGV[a + 5])
  if ARGV[a + 6] ~= '' then
    redis.call('HSET', KEYS[1], 'cbof:' .. kind, ARGV[a + 6])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
