-- The wire form of a job that waits, runs or is delayed (the dashboard's job page): looked
-- for among the first ARGV[2] entries of each stream (acknowledged entries are deleted, so a
-- stream holds the waiting and the running jobs) and the ARGV[2] soonest members of each
-- delayed set.
-- KEYS: the streams, then the delayed sets, of the levels in use; ARGV[1] '"id":"<job id>"',
-- ARGV[2] most entries looked at per key, ARGV[3] how many of KEYS are streams
-- Returns the job's JSON, or false.
local most, streams = tonumber(ARGV[2]), tonumber(ARGV[3])
for i, key in ipairs(KEYS) do
  if i <= streams then
    local ok, entries = pcall(redis.call, 'XRANGE', key, '-', '+', 'COUNT', most)
    if ok then
      for _, entry in ipairs(entries) do
        local fields = entry[2]
        for f = 1, #fields, 2 do
          if fields[f] == 'j' and string.find(fields[f + 1], ARGV[1], 1, true) then
            return fields[f + 1]
          end
        end
      end
    end
  else
    local ok, members = pcall(redis.call, 'ZRANGE', key, 0, most - 1)
    if ok then
      for _, member in ipairs(members) do
        if string.find(member, ARGV[1], 1, true) then
          return member
        end
      end
    end
  end
end
return false
