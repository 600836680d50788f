-- Update a running job's progress, message and lease expiry in its record, only while the
-- record reads running under the caller's fencing token: a job that has ended (or runs again
-- elsewhere) is never changed, and a missing record is never recreated. Its TTL is kept.
-- KEYS[1] record; ARGV[1] fencing token ('' for any), ARGV[2..] field/value pairs
-- Returns 1 when updated, 0 when not.
local cur = redis.pcall('HMGET', KEYS[1], 'state', 'fencing_token')
if cur.err or cur[1] ~= 'running' then
  return 0
end
if ARGV[1] ~= '' and cur[2] ~= ARGV[1] then
  return 0
end
if #ARGV > 1 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
end
return 1
