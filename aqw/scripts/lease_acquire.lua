-- Acquire a lease: SET key token NX PX ttl, and on success hand out the next fencing token.
-- KEYS[1] lease key, KEYS[2] fencing counter
-- ARGV[1] token, ARGV[2] ttl in ms
-- Returns the fencing token (a strictly increasing integer), or false when the key is held.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
