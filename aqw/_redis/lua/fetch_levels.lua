-- Read new entries from the streams of a queue's priority levels in one step, without
-- blocking (aqw/brokers/_redis_levels.py): the highest level first, each read taking what
-- is left of the count, until the count is filled. A share fetch (ARGV[4] = '1', the
-- anti-starvation share of the lower levels) first reads the lowest level that has
-- entries, then the higher ones from the top.
-- The levels set is read in the same step, so that a worker learns of a level first used by
-- another process at its next fetch, not a refresh later: a high-priority job behind a
-- backlog of low ones is read before any further low one.
-- When the set holds a level the caller does not read, nothing is read: the caller reads
-- again with it (so a lower level is never handed out first for want of knowing a higher);
-- so too when it marks a level as holding fair jobs ('f<level>': fair_fetch.lua reads those).
-- KEYS[1] the levels set, then the level streams the caller reads, highest level first (all
--   in the queue's slot)
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] count, ARGV[4] '1' for a share fetch, else '0',
--   then the levels (1-9) the caller reads
-- Returns the levels set's members (an empty list when it is missing or not a set), then per
-- entry read (3): the index in KEYS of its stream, its id, its field/value list.
local group, consumer, left = ARGV[1], ARGV[2], tonumber(ARGV[3])
local members = redis.pcall('SMEMBERS', KEYS[1])
if type(members) ~= 'table' or members.err then
  members = {}
end
local known = {}
for a = 5, #ARGV do
  known[ARGV[a]] = true
end
for _, level in ipairs(members) do
  if (not known[level] and string.match(level, '^[1-9]$')) or string.match(level, '^f') then
    return {members}  -- 'f<level>': fair jobs, read by fair_fetch.lua (_fair.py)
  end
end
local out, n = {members}, 1
local function read(i)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', left,
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
local top = #KEYS
if ARGV[4] == '1' then
  -- the lowest level with entries first; the levels below it are empty, so end above it
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
