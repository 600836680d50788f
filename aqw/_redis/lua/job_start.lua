-- Start jobs: take each job's lease and mark its record running, in one step, unless the job
-- was cancelled: before it started, or while an earlier attempt of it ran (its record has
-- cancel = 1: a reclaimed or handed back delivery of it does not run again). Then nothing is
-- touched. A start is only for a live delivery: when its stream entry is no longer pending to
-- this consumer (in its level's stream: another consumer claimed it after this one paused,
-- and may have run and settled it), or its record has ended (succeeded, failed, dead,
-- expired), nothing is taken, written or counted and no fencing token is handed out; the
-- entry of an ended job, still pending to this consumer, is dropped (XACK and XDEL: a
-- leftover delivery, nothing is left to run). The leases share one fencing counter (the
-- queue's): SET key token NX PX ttl for
-- each, and each lease taken gets the next fencing token. A key this very token already holds
-- (a retried call whose reply was lost) is taken again, with a new token: fencing tokens only
-- have to grow, not to be consecutive.
-- Mergeable (aqw/_redis/batch.py): jobs started at the same moment share one call, so the
-- per-job part is as small as it can be: the keys are built here from the queue's prefix
-- (all in the queue's slot) and the time is the server's.
--
-- Flow control (aqw/brokers/_flow.py), checked after the lease is known free and before
-- anything is written, so a refused job changes nothing but its rate bucket's queue mark:
-- * a rate bucket (`rate:<bucket>`, a hash) is GCRA: field t is the theoretical arrival time
--   (server microseconds); a start at now >= t - tolerance is admitted and sets
--   t = max(t, now) + interval. A refused job is told to come back at its turn: field w is
--   the turn last promised, each refusal promises the next one (max(t - tolerance, w), then
--   w moves on by interval), so jobs refused together return spread out, not all at once.
--   The hash expires (PX) once both times have passed: idle buckets vanish.
-- * a per-key cap (`slots:<key>`, a ZSET of its holders' lease key names) drops the members
--   whose lease key no longer exists (a finished job's lease is deleted by its settle step, a
--   crashed holder's expires), then admits while fewer than max remain; the ZSET lives as
--   long as its longest lease (job_renew.lua moves it on). A lease this job already holds (a
--   retried call) counts as its own slot.
--
-- The counter is checked first (as in lease_acquire_many.lua): if it is not a non-negative
-- integer, or handing out a token to every job asked for would pass 2^53 - 1
-- (9007199254740991), nothing is written and the reply is an error starting "AQWFENCE".
--
-- A record key holding another type than a hash (damaged) is left alone: the lease is taken.
-- The running index (the list `aqw status` reads) is not written here: a job enters it once
-- it has run a while (job_progress.lua), so short jobs cost nothing there.
-- KEYS[1] fencing counter
-- ARGV[1] key prefix (aqw:{q}:), ARGV[2] worker (the consumer), ARGV[3] record ttl in ms,
--   ARGV[4] lease ttl in ms, ARGV[5] consumer group, then per job: its head,
--   "<m> <lease token> <attempt> <level> <entry id> <job id>" (one value, so a job without
--   limits passes one value: the client's cost of a call grows with the number of values;
--   the job id comes last and may hold spaces), where level is the priority level of the
--   stream the entry was read from and the entry id '-' when there is no delivery to check,
--   m is the count of limit values that follow, then m values: rate bucket ('' for none),
--   interval and burst tolerance in microseconds, number of caps n, then n pairs
--   (concurrency key, most holders)
-- The counter is read once and written once (INCRBY of the tokens handed out), and the fields
-- of an earlier wait or run are deleted only when the record has one: per job, the work is
-- the few commands the job's own keys need. A plain job's start is three commands: HMGET of
-- its record, SET of its lease, HSET of its record (whose TTL, set at enqueue and moved on by
-- job_renew.lua, is only set here for a record this step creates); the delivery is checked
-- with XPENDING only when the record is not a fresh, unclaimed queued one (see below).
-- Returns one reply per job: its fencing token, 0 when its lease is held by another token,
-- -1 when the job was cancelled, -2 when its entry is not pending to this consumer, -3 when
-- its record has ended, {'rate_limit', microseconds until its turn} or
-- {'concurrency', the holders' shortest remaining lease in ms (0: unknown)} when a limit
-- refused it.
local limit = 9007199254740991
local n = 0
local a = 6
while a <= #ARGV do
  n = n + 1
  a = a + 1 + tonumber(string.match(ARGV[a], '^%d+'))
end
local value = redis.pcall('GET', KEYS[1])
local damage = nil
if type(value) == 'table' then
  damage = 'not a string (' .. tostring(value.err) .. ')'
elseif value then
  local ok = value == '0' or (#value <= 16 and string.match(value, '^[1-9]%d*$') ~= nil)
  if not ok or tonumber(value) + n > limit then
    damage = "'" .. string.sub(value, 1, 40) .. "'"
  end
end
if damage then
  local shown = string.gsub(KEYS[1] .. ' is damaged or exhausted: ' .. damage, '[%c\128-\255]', '?')
  return redis.error_reply('AQWFENCE fencing counter ' .. shown)
end
local prefix, worker, keep, ttl, group = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local final = {succeeded = true, failed = true, dead = true, expired = true}
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = now_us / 1e6
local started = string.format('%.6f', now)
local expires = string.format('%.6f', now + tonumber(ttl) / 1000)

-- The live holders of cap `slots` other than `lease`, after dropping the dead ones; and the
-- shortest remaining lease among them (ms, 0 when none or unknown). `mine` when `lease` is one.
local function holders(slots, lease)
  local live, soonest, mine = 0, 0, false
  for _, member in ipairs(redis.call('ZRANGE', slots, 0, -1)) do
    local left = redis.call('PTTL', member)
    if member == lease then
      mine = true
    elseif left == -2 then
      redis.call('ZREM', slots, member)
    else
      live = live + 1
      if left > 0 and (soonest == 0 or left < soonest) then
        soonest = left
      end
    end
  end
  return live, soonest, mine
end

local function expire_after(key, ms)
  if ms > 0 then
    redis.call('PEXPIRE', key, math.ceil(ms))
  end
end

-- True when entry `entry` of level `level`'s stream is pending to this consumer.
local function pending(level, entry)
  local stream = prefix .. (level == '0' and 'stream' or 'stream:p' .. level)
  local p = redis.pcall('XPENDING', stream, group, entry, entry, 1, worker)
  return p.err == nil and #p > 0, stream
end

local fenced = tonumber(value) or 0  -- the last token handed out
-- Run as one protected call: whatever error stops it midway, the tokens of the leases it
-- took are counted before the error is returned, so no token is ever handed out twice.
local out = {}
local function start_all()
  a = 6
  while a <= #ARGV do
    local m, token, attempt, level, entry, job =
      string.match(ARGV[a], '^(%d+) (%S+) (%d+) (%d+) (%S+) (.*)$')
    local bucket, interval, tolerance, ncaps, caps = '', 0, 0, 0, a + 1
    if m ~= '0' then
      bucket, interval, tolerance = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
      ncaps, caps = tonumber(ARGV[a + 4]), a + 5
    end
    a = a + 1 + tonumber(m)
    local lease, rec = prefix .. 'lease:' .. job, prefix .. 'job:' .. job
    local cur = redis.pcall('HMGET', rec, 'state', 'cancel', 'progress', 'message', 'run_at',
      'claimed')
    local damaged = cur.err ~= nil
    -- The delivery is checked against the stream's pending list only when the record is not
    -- fresh: a queued record no other consumer claimed (reclaim.lua marks it when it takes a
    -- delivery over) has no other live delivery than the one this consumer read.
    local live, stream = true, nil
    if entry ~= '-' and (damaged or cur[1] ~= 'queued' or (cur[6] and cur[6] ~= worker)) then
      live, stream = pending(level, entry)
    end
    local cancelled = not damaged and (cur[1] == 'cancelled' or cur[2] == '1')
    local ended = live and not damaged and not cancelled and final[cur[1]] == true
    local held, taken = false, false
    if not live then
      out[#out + 1] = -2
    elseif ended then
      if stream then  -- a leftover delivery of an ended job: nothing is left to run
        redis.call('XACK', stream, group, entry)
        redis.call('XDEL', stream, entry)
      end
      out[#out + 1] = -3
    elseif not cancelled and m == '0' then  -- no limit to check first: take a free lease now
      taken = redis.call('SET', lease, token, 'NX', 'PX', ttl) ~= false
      if not taken then  -- held: by whom (SET NX GET would need Redis 7)
        held = redis.call('GET', lease)
      end
    elseif not cancelled then
      held = redis.call('GET', lease)
    end
    local refused = nil
    if not live or ended then
      -- refused above: nothing taken or written
    elseif cancelled then
      out[#out + 1] = -1
    elseif held and held ~= token then
      out[#out + 1] = 0
    else
      local rate, tat, promised = nil, 0, 0
      if bucket ~= '' then
        rate = prefix .. 'rate:' .. bucket
        local got = redis.call('HMGET', rate, 't', 'w')
        tat, promised = tonumber(got[1]) or 0, tonumber(got[2]) or 0
        if tat - tolerance > now_us and not held then
          local turn = math.max(tat - tolerance, promised)
          redis.call('HSET', rate, 'w', string.format('%d', turn + interval))
          expire_after(rate, (turn + interval - now_us) / 1000)
          refused = {'rate_limit', turn - now_us}
        end
      end
      for c = caps, caps + 2 * (ncaps - 1), 2 do
        if refused then
          break
        end
        local live, soonest, mine = holders(prefix .. 'slots:' .. ARGV[c], lease)
        if not mine and live >= tonumber(ARGV[c + 1]) then
          refused = {'concurrency', soonest}
        end
      end
      if refused then
        out[#out + 1] = refused
      else
        if not taken then  -- a limited job, or a key this token already held: (re)take it
          redis.call('SET', lease, token, 'PX', ttl)
        end
        fenced = fenced + 1
        local fence = fenced
        if rate and not held then
          local nxt = math.max(tat, now_us) + interval
          redis.call('HSET', rate, 't', string.format('%d', nxt))
          expire_after(rate, (math.max(nxt, promised) - now_us) / 1000)
        end
        for c = caps, caps + 2 * (ncaps - 1), 2 do
          local slots = prefix .. 'slots:' .. ARGV[c]
          redis.call('ZADD', slots, now, lease)
          if redis.call('PTTL', slots) < tonumber(ttl) then
            redis.call('PEXPIRE', slots, ttl)
          end
        end
        if not damaged then
          redis.call('HSET', rec, 'state', 'running', 'attempts', attempt,
            'started_at', started, 'worker', worker, 'fencing_token', fence,
            'lease_expires_at', expires)
          if cur[3] or cur[4] or cur[5] then  -- of an earlier wait or run
            redis.call('HDEL', rec, 'progress', 'message', 'run_at')
          end
          if not cur[1] then  -- a record written here: it lives as long as an unfinished one
            redis.call('PEXPIRE', rec, keep)
          end
        end
        out[#out + 1] = fence
      end
    end
  end
end
local ok, err = pcall(start_all)
if fenced > (tonumber(value) or 0) then
  redis.call('INCRBY', KEYS[1], fenced - (tonumber(value) or 0))
end
if not ok then
  error(err)
end
return out
