-- Release a lease only while it is still ours: compare the token, then DEL. Never DEL by key alone.
-- KEYS[1] lease key; ARGV[1] token. Returns 1 when released, 0 when it was not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
