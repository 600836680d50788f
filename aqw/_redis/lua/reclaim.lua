-- Claim pending entries abandoned by a consumer that stopped, each by its own job's lease TTL.
-- For each candidate: skip it while its job's lease key exists (a live holder, however late
-- its keep_alive, is never robbed), else XCLAIM it with its own min idle time, so the idle
-- check is atomic with the claim (an entry refreshed since the caller looked is left alone).
-- XCLAIM (without JUSTID) counts one more delivery; the new count is read back from XPENDING.
-- An entry deleted from the stream while pending is dropped from the PEL by XCLAIM (Redis 7)
-- and not returned.
-- A claimed job's record (when it has one) is marked claimed by this consumer (field
-- claimed): a start of the delivery by its earlier consumer is then checked against the
-- pending list (job_start.lua), not taken for a fresh one.
-- KEYS[1] stream, then per entry: its job's lease key (any key of the queue when unchecked),
--   then per entry, in the same order: its job's record key (any key of the queue when
--   unchecked)
-- ARGV[1] group, ARGV[2] consumer, then per entry: entry id, min idle ms, check lease (1/0)
-- Returns {entry id, times delivered} for each entry claimed, in order.
local out = {}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local a = 3 + (i - 1) * 3
  local entry, idle, check = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  if check == '0' or redis.call('EXISTS', KEYS[1 + i]) == 0 then
    local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], idle, entry)
    if claimed[1] then
      -- mark the job's record (when it has one) as claimed by this consumer: a start of the
      -- delivery by its earlier consumer is then checked against the pending list
      -- (job_start.lua), not taken for a fresh one
      local rec = KEYS[1 + n + i]
      if check == '1' and redis.call('EXISTS', rec) == 1 then
        redis.pcall('HSET', rec, 'claimed', ARGV[2])
      end
      local p = redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1)
      if #p > 0 then
        out[#out + 1] = {entry, p[1][4]}
      end
    end
  end
end
return out
