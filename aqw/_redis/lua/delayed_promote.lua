-- Make one delayed job due now (the dashboard's "run now", aqw queue promote): the first
-- member, among the ARGV[3] soonest due of each delayed set, whose wire form holds ARGV[1]
-- (the JSON of its id field) gets score ARGV[2]; the workers' promote pass moves it.
-- KEYS: the delayed sets of the levels in use
-- ARGV[1] '"id":"<job id>"', ARGV[2] now (ms), ARGV[3] most members looked at per set
-- Returns 1 (made due), 0 (not found).
for _, key in ipairs(KEYS) do
  local members = redis.call('ZRANGE', key, 0, tonumber(ARGV[3]) - 1)
  for _, member in ipairs(members) do
    if string.find(member, ARGV[1], 1, true) then
      redis.call('ZADD', key, 'XX', ARGV[2], member)
      return 1
    end
  end
end
return 0
