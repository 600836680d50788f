-- Open a batch (batch_lib.lua has its keys): state open, its options and its callbacks'
-- jobs; with a parent, the new batch is added to that open batch as its child batch:<id>.
-- KEYS[1] the batch's hash
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] batch id, ARGV[3] fail_fast ('1' or '0'),
--   ARGV[4] keep ms once complete, ARGV[5] the callbacks' key ttl ms, ARGV[6] parent id ('' none),
--   ARGV[7] ms an unfinished batch lives, then per callback (6): kind, job JSON, job id,
--   task, stream key, enqueued_at
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
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'state', 'open', 'total', 0, 'fail_fast', ARGV[3], 'keep', ARGV[4],
  'key_ttl', ARGV[5], 'parent', parent, 'created_at',
  string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1e6))
if parent == '' then
  redis.call('HDEL', KEYS[1], 'parent')
end
for a = 8, #ARGV, 6 do
  local kind = ARGV[a]
  redis.call('HSET', KEYS[1], 'cb:' .. kind, ARGV[a + 1], 'cbid:' .. kind, ARGV[a + 2],
    'cbtask:' .. kind, ARGV[a + 3], 'cbstream:' .. kind, ARGV[a + 4], 'cbat:' .. kind, ARGV[a + 5])
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
