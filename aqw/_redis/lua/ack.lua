-- Settle finished jobs: acknowledge and delete each entry (the stream only keeps unfinished
-- work, so it stays bounded), release its lease, write its completion record when the job has
-- an idempotency key, end its job record (aqw/record.py) and wake whoever waits for it, count
-- it. An entry whose lease another holder has taken, or that is no longer pending (another
-- holder settled it), is refused: that holder owns the job. When the lease key is absent (it
-- expired, or no lease was used), the entry must still be pending to this consumer: one that
-- another consumer has claimed (and not yet leased) is refused too, so a holder paused past
-- its lease cannot settle a job that is running again elsewhere.
--
-- The job record takes the given state and fields, and the consumer as its worker, and lives
-- the given keep time; it leaves the running index. A record that has already ended (a job cancelled before it started,
-- acknowledged by the worker that fetched it) is left as it is and not counted again; a
-- record key of another type than a hash is left alone. Waking: the job id is pushed to each
-- inbox in the job's waiters set (aqw/_redis/waiters.py), which lives 5 minutes, and the set
-- is deleted. Counting: 'processed' for succeeded, else the state's name, in the stats hash.
-- KEYS[1] stream, KEYS[2] stats hash, KEYS[3] running index, then per job: lease key,
--   completion record key, job record, waiters set
-- ARGV[1] group, ARGV[2] consumer, then per job: entry id, lease token ('' for none),
--   completion record ttl in ms (0: none), job id ('' when undecodable: no job record),
--   final state, job record ttl in ms, count of the field/value values that follow, values
-- Returns one reply per job: 1 when acknowledged, 0 when refused.
local final = {succeeded = true, failed = true, dead = true, cancelled = true, expired = true}
local function ours(entry)
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1)
  return #p > 0 and p[1][2] == ARGV[2]
end
local function wake(waiters, job)
  local inboxes = redis.pcall('SMEMBERS', waiters)
  if inboxes.err then
    return
  end
  for _, inbox in ipairs(inboxes) do
    redis.pcall('RPUSH', inbox, job)
    redis.pcall('PEXPIRE', inbox, 300000)
  end
  if #inboxes > 0 then
    redis.call('DEL', waiters)
  end
end
local out = {}
local counts = {}
local a = 3
for i = 4, #KEYS, 4 do
  local lease, done, rec, waiters = KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]
  local entry, token, ttl, job = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3]
  local state, keep, nvalues = ARGV[a + 4], ARGV[a + 5], tonumber(ARGV[a + 6])
  local first = a + 7
  a = first + nvalues
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
      redis.call('SET', done, job, 'PX', ttl)
    end
    local count = true
    if job ~= '' then
      local was = redis.pcall('HGET', rec, 'state')
      if type(was) ~= 'table' then
        if was and final[was] then
          count = false
        else
          redis.call('HSET', rec, 'state', state, 'worker', ARGV[2], unpack(ARGV, first, a - 1))
          redis.call('PEXPIRE', rec, keep)
          wake(waiters, job)
        end
      end
      redis.call('ZREM', KEYS[3], job)
    end
    if count then
      local name = state == 'succeeded' and 'processed' or state
      counts[name] = (counts[name] or 0) + 1
    end
    out[#out + 1] = 1
  end
end
for name, n in pairs(counts) do
  redis.call('HINCRBY', KEYS[2], name, n)
end
return out
