-- Settle finished jobs: acknowledge and delete each entry (the stream only keeps unfinished
-- work, so it stays bounded), release its lease, write its completion record when the job has
-- an idempotency key, end its job record (aqw/record.py) and wake whoever waits for it, count
-- it. An entry whose lease another holder has taken, or that is no longer pending (another
-- holder settled it), is refused: that holder owns the job. When the lease key is absent (it
-- expired, or no lease was used), the entry must still be pending to this consumer: one that
-- another consumer has claimed (and not yet leased) is refused too, so a holder paused past
-- its lease cannot settle a job that is running again elsewhere.
--
-- The job record takes the given state, its finish time (the server's), the consumer as its
-- worker and the job's own field/value pairs (a result, its last error), and lives the given
-- keep time; it leaves the running index if it entered it. A record that has already ended
-- (a job cancelled before it started, acknowledged by the worker that fetched it) is left as
-- it is and not counted again; a record key of another type than a hash is left alone.
-- Waking, only when someone waits (result_watch.lua marks the record): the job id is pushed to
-- each inbox in the job's waiters set (aqw/_redis/waiters.py), which lives 5 minutes, and the
-- set is deleted. Counting: 'processed' for succeeded, else the state's name, in the stats hash.
-- Mergeable (aqw/_redis/batch.py): what the jobs of one flush share is passed once, and the
-- per-job keys are built here from the queue's prefix (all in the queue's slot).
-- Ownership, in the common case without a command of its own: the job's record (read anyway,
-- for its state and the fields below) names the fencing token of the last start of the job
-- (job_start.lua writes it with the lease, in the same step, whenever the record is a
-- readable hash). When it is this lease's token and no other consumer has claimed the
-- delivery since (reclaim.lua marks the record 'claimed'), no other start has happened: the
-- lease key is this holder's or has expired untaken, and the entry is still this consumer's
-- unless XACK says it was settled. Otherwise (another fence, a claim by another consumer, no
-- fence given, a record that is missing or not a hash) the lease key and the pending list
-- decide, as above.
-- Acknowledging, in the common case without a command per job either: one XPENDING over the
-- range of the call's entry ids reads which are still pending to this consumer (what XACK's
-- reply and the per-entry XPENDING told), and one XACK acknowledges the accepted entries
-- after the loop, with their XDEL. A plain job's settle is then HMGET, HSET and PEXPIRE of
-- its record, the rest shared by the jobs of the call.
-- KEYS[1] stream, KEYS[2] stats hash, KEYS[3] running index
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] key prefix (aqw:{q}:), ARGV[4] final state,
--   ARGV[5] job record ttl in ms, ARGV[6] completion record ttl in ms (0: none), then per job:
--   its head, "<m> <entry id> <lease token> <fencing token> <job id>" (one value, so most
--   jobs pass one: the client's cost of a call grows with the number of values), where the
--   tokens are empty for none and the job id empty when the job is undecodable (no job
--   record), and comes last (it
--   may hold spaces); m is the count of values that follow (0 for a job without an
--   idempotency key, result or error), then m values: the idempotency key ('' for none) and
--   the record's field/value pairs
-- Returns one reply per job: 1 when acknowledged, 0 when refused.
-- Batches: a child's record names its batch ('batch', read with the fields below: no command
-- more for a job of no batch); it is counted there once (batch_lib.lua), in this step.
--@include batch_lib
local final = {succeeded = true, failed = true, dead = true, cancelled = true, expired = true}
local prefix, state, keep, done_ttl = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
-- The call's entries still pending to this consumer: read with one XPENDING over the range
-- of the call's entry ids, filtered by consumer (so it reads no more than this consumer's
-- own deliveries, however many other consumers have in flight), and a job's settle needs no
-- command of its own for its entry (before: an XACK per entry, whose reply 0 refused an entry
-- settled already, and an XPENDING per entry on the path without the record's fence). An
-- entry not found there (not pending, or pending to another consumer) is looked up alone,
-- as before. The entries settled are acknowledged together after the loop; an entry settled
-- in the call counts as no longer pending at once (`done`), so a second settle of it in the
-- same call is refused, as XACK's reply 0 refused it. When an entry id is malformed, or the
-- range holds more entries than one read returns, each entry is acknowledged alone
-- (`bulk` false).
local pending, done, bulk, none = {}, {}, true, false
do
  local lo, hi = nil, nil
  local a = 7
  while a <= #ARGV do
    local m, entry = string.match(ARGV[a], '^(%d+) (%S+) ')
    local ms, seq = string.match(entry or '', '^(%d+)%-(%d+)$')
    if not ms or #ms > 15 or #seq > 15 then
      bulk = false
      break
    end
    local key = {tonumber(ms), tonumber(seq)}
    if not lo or key[1] < lo[1] or (key[1] == lo[1] and key[2] < lo[2]) then
      lo = key
    end
    if not hi or key[1] > hi[1] or (key[1] == hi[1] and key[2] > hi[2]) then
      hi = key
    end
    a = a + 1 + tonumber(m)
  end
  if bulk and lo then
    local cap = 10000
    local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], string.format('%d-%d', lo[1], lo[2]),
      string.format('%d-%d', hi[1], hi[2]), cap, ARGV[2])
    if p.err then
      none = true  -- no stream or no group: nothing is pending
    elseif #p >= cap then
      bulk = false
    else
      for _, e in ipairs(p) do
        pending[e[1]] = true
      end
    end
  end
end
-- The consumer entry `entry` is pending to, or nil.
local function owner(entry)
  if done[entry] or none then
    return nil
  elseif bulk and pending[entry] then
    return ARGV[2]
  end
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1)
  return #p > 0 and p[1][2] or nil
end
local function ours(entry)
  return owner(entry) == ARGV[2]
end
local function wake(job)
  local waiters = prefix .. 'waiters:' .. job
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
local finished = nil
local out = {}
-- The entries acknowledged and the lease keys released: deleted together after the loop (no
-- later job of the call reads them: a lease key is only ever released by its own token).
local settled, released = {}, {}
local counted = 0
-- One protected call: whatever error stops it midway, the entries it acknowledged are
-- still deleted from the stream.
local function settle_all()
  local a = 7
  while a <= #ARGV do
    local m, entry, token, fence, job = string.match(ARGV[a], '^(%d+) (%S+) (%S*) (%d*) (.*)$')
    m = tonumber(m)
    local idem = m > 0 and ARGV[a + 1] or ''
    local first = a + 2  -- the first field/value value, when m > 1
    a = a + 1 + m
    -- Without a lease (token ''), as before a lease was taken: the entry's ownership decides.
    local lease = prefix .. 'lease:' .. ((token ~= '' and job ~= '') and job or '-')
    local rec = prefix .. 'job:' .. (job ~= '' and job or '-')
    local was = nil
    if job ~= '' then
      was = redis.pcall('HMGET', rec, 'state', 'waited', 'indexed', 'batch', 'fencing_token',
        'claimed')
    end
    local fenced = token ~= '' and fence ~= '' and was ~= nil and not was.err
      and was[5] == fence and (not was[6] or was[6] == ARGV[2])
    local cur = nil
    if not fenced then
      cur = redis.call('GET', lease)
    end
    if (not fenced and ((cur and cur ~= token) or (not cur and not ours(entry))))
        or not owner(entry) then
      -- another holder owns the lease or the entry, or already settled the entry
      out[#out + 1] = 0
    else
      settled[#settled + 1] = entry
      done[entry] = true
      if not bulk then  -- else acknowledged with the others after the loop
        redis.call('XACK', KEYS[1], ARGV[1], entry)
      end
      if fenced or cur then  -- (an expired lease key is deleted for nothing: no command more)
        released[#released + 1] = lease
      end
      if done_ttl > 0 and idem ~= '' then
        redis.call('SET', prefix .. 'done:' .. idem, job, 'PX', done_ttl)
      end
      local count = true
      if was ~= nil then
        if not was.err then
          if was[1] and final[was[1]] then
            count = false
          else
            if not finished then
              local t = redis.call('TIME')
              finished = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1e6)
            end
            redis.call('HSET', rec, 'state', state, 'worker', ARGV[2], 'finished_at', finished,
              unpack(ARGV, first, a - 1))
            redis.call('PEXPIRE', rec, keep)
            if was[2] then
              wake(job)
            end
          end
          if was[3] then
            redis.call('ZREM', KEYS[3], job)
          end
          if was[4] then  -- a batch's child: counted once, with its record's final state
            -- protected: damage in a batch's keys never fails the settle of its child
            pcall(batch_settled, prefix, was[4], job, (was[1] and final[was[1]]) and was[1] or state)
          end
        end
      end
      if count then
        counted = counted + 1
      end
      out[#out + 1] = 1
    end
  end
end
local ok, err = pcall(settle_all)
-- in chunks: a call's values go on Lua's stack
for i = 1, #settled, 1000 do
  if bulk then
    redis.call('XACK', KEYS[1], ARGV[1], unpack(settled, i, math.min(i + 999, #settled)))
  end
  redis.call('XDEL', KEYS[1], unpack(settled, i, math.min(i + 999, #settled)))
end
for i = 1, #released, 1000 do
  redis.call('DEL', unpack(released, i, math.min(i + 999, #released)))
end
if not ok then
  error(err)
end
if counted > 0 then
  redis.call('HINCRBY', KEYS[2], state == 'succeeded' and 'processed' or state, counted)
end
return out
