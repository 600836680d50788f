-- Renew a lease only while it is still ours: compare the token, then PEXPIRE.
-- KEYS[1] lease key; ARGV[1] token, ARGV[2] ttl in ms. Returns 1 when renewed, 0 when not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
