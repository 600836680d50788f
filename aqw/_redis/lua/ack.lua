-- Settle finished jobs: acknowledge and delete each entry (the stream only keeps unfinished
-- work, so it stays bounded), release its lease, write its completion record when the job has
-- an idempotency key, count it. An entry whose lease another holder has taken, or that is no
-- longer pending (another holder settled it), is refused: that holder owns the job. When the
-- lease key is absent (it expired, or no lease was used), the entry must still be pending to
-- this consumer: one that another consumer has claimed (and not yet leased) is refused too,
-- so a holder paused past its lease cannot settle a job that is running again elsewhere.
-- KEYS[1] stream, KEYS[2] stats hash, then per job: lease key, completion record key
-- ARGV[1] group, ARGV[2] consumer, then per job: entry id, lease token ('' for none),
--   record ttl in ms (0: none), job id
-- Returns one reply per job: 1 when acknowledged, 0 when refused.
local function ours(entry)
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1)
  return #p > 0 and p[1][2] == ARGV[2]
end
local out = {}
local done = 0
local n = (#KEYS - 2) / 2
for i = 0, n - 1 do
  local lease, record = KEYS[3 + i * 2], KEYS[4 + i * 2]
  local a = 3 + i * 4
  local entry, token, ttl, job = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3]
  local cur = redis.call('GET', lease)
  if (cur and cur ~= token) or (not cur and not ours(entry))
      or redis.call('XACK', KEYS[1], ARGV[1], entry) == 0 then
    -- another holder owns the lease or the entry, or already settled the entry
    out[#out + 1] = 0
  else
    redis.call('XDEL', KEYS[1], entry)
    if cur then
      redis.call('DEL', lease)
    end
    if ttl > 0 then
      redis.call('SET', record, job, 'PX', ttl)
    end
    done = done + 1
    out[#out + 1] = 1
  end
end
if done > 0 then
  redis.call('HINCRBY', KEYS[2], 'processed', done)
end
return out
