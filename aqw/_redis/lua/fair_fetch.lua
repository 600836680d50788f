-- fetch_levels.lua for a queue whose levels hold fair jobs (fair_enqueue.lua describes the
-- keys): read new entries from the levels' streams, highest level first (a share fetch:
-- the lowest level with entries first), and when a level's stream has fewer new entries
-- than are wanted, pick the rest from the level's fair keys by start-time fair queueing
-- (the active key with the least start tag; its tag then grows by 1/weight), move each
-- picked job to the stream and read it, all in this one step. Each pick is O(log keys).
-- A job's share is charged when it is picked: jobs already started count toward their
-- key's share.
-- KEYS[1] the levels set, then the level streams the caller reads, highest level first
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] count, ARGV[4] '1' for a share fetch, else '0',
--   ARGV[5] key prefix (aqw:{q}:), then the levels of KEYS[2..] in order (0 included)
-- Returns what fetch_levels.lua returns: the levels set's members, then per entry read
-- (3): the index in KEYS of its stream, its id, its field/value list.
local group, consumer, left, prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[5]
local members = redis.pcall('SMEMBERS', KEYS[1])
if type(members) ~= 'table' or members.err then
  members = {}
end
local known, fair = {}, {}
for a = 6, #ARGV do
  known[ARGV[a]] = true
end
for _, member in ipairs(members) do
  if not known[member] and string.match(member, '^[1-9]$') then
    return {members}
  end
  local f = string.match(member, '^f([0-9])$')
  if f then
    fair[f] = true
  end
end
local out, n = {members}, 1
local function xread(i, count)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
    'STREAMS', KEYS[i], '>')
  if type(reply) ~= 'table' or #reply == 0 then
    return 0
  end
  -- Redis replies {{stream, entries}}; fakeredis 2.41 {stream, entries}.
  local entries = type(reply[1]) == 'table' and reply[1][2] or reply[2]
  for _, entry in ipairs(entries) do
    out[n + 1], out[n + 2], out[n + 3] = i, entry[1], entry[2]
    n = n + 3
  end
  left = left - #entries
  return #entries
end
-- Move up to `want` picked jobs of `level` to the stream KEYS[i]; the number moved.
local function pick(i, level, want)
  local base = prefix .. 'fair' .. (level == '0' and '' or ':p' .. level) .. ':'
  local active, weights = base .. 'active', base .. 'w'
  local moved, start = 0, nil
  while moved < want do
    local top = redis.call('ZRANGE', active, 0, 0, 'WITHSCORES')
    if #top == 0 then
      break
    end
    local key = top[1]
    start = tonumber(top[2])
    local list = base .. 'q:' .. key
    local job = redis.call('LPOP', list)
    if job then
      redis.call('XADD', KEYS[i], '*', 'j', job)
      moved = moved + 1
    end
    local w = tonumber(redis.call('HGET', weights, key)) or 1
    local finish = string.format('%.17g', start + 1 / w)
    if job and redis.call('EXISTS', list) == 1 then
      redis.call('ZADD', active, finish, key)
    else
      redis.call('ZREM', active, key)
      redis.call('HDEL', weights, key)
      redis.call('ZADD', base .. 'idle', finish, key)
    end
  end
  if start then
    local clock = string.format('%.17g', start)
    redis.call('SET', base .. 'clock', clock)
    redis.call('ZREMRANGEBYSCORE', base .. 'idle', '-inf', clock)
    if moved > 0 then
      redis.call('DECRBY', base .. 'n', moved)
    end
    if redis.call('EXISTS', active) == 0 then
      -- nothing waits: the turn starts over (no key is behind another)
      redis.call('DEL', base .. 'idle', base .. 'clock', base .. 'n')
    end
  end
  return moved
end
local function read(i)
  local got = xread(i, left)
  local level = ARGV[4 + i]
  if left > 0 and fair[level] then
    local moved = pick(i, level, left)
    if moved > 0 then
      got = got + xread(i, moved)
    end
  end
  return got
end
local top = #KEYS
if ARGV[4] == '1' then
  while top > 2 and left > 0 do
    local got = read(top)
    top = top - 1
    if got > 0 then
      break
    end
  end
end
for i = 2, top do
  if left <= 0 then
    break
  end
  read(i)
end
return out
