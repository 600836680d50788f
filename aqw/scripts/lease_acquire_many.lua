-- Acquire several leases that share one fencing counter (the job leases of one queue):
-- SET key token NX PX ttl for each, and hand each lease taken the next fencing token.
-- KEYS[1] fencing counter, KEYS[2..] lease keys
-- ARGV per lease: token, ttl in ms
-- Returns one reply per lease: its fencing token, or 0 when the key is held.
local out = {}
for i = 2, #KEYS do
  local a = (i - 2) * 2 + 1
  if redis.call('SET', KEYS[i], ARGV[a], 'NX', 'PX', ARGV[a + 1]) then
    out[#out + 1] = redis.call('INCR', KEYS[1])
  else
    out[#out + 1] = 0
  end
end
return out
