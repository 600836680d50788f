-- Settle finished jobs: acknowledge and delete each entry (the stream only keeps unfinished
-- work, so it stays bounded), release its lease, count it. An entry whose lease another holder
-- has taken is refused: that holder now owns the job and settles it.
-- KEYS[1] stream, KEYS[2] stats hash, KEYS[3..] one lease key per job
-- ARGV[1] group, then per job: entry id, lease token ('' for none)
-- Returns one reply per job: 1 when acknowledged, 0 when refused.
local out = {}
local done = 0
for i = 3, #KEYS do
  local a = 2 + (i - 3) * 2
  local entry, token = ARGV[a], ARGV[a + 1]
  local cur = redis.call('GET', KEYS[i])
  if cur and cur ~= token then
    out[#out + 1] = 0
  else
    redis.call('XACK', KEYS[1], ARGV[1], entry)
    redis.call('XDEL', KEYS[1], entry)
    if cur then
      redis.call('DEL', KEYS[i])
    end
    done = done + 1
    out[#out + 1] = 1
  end
end
if done > 0 then
  redis.call('HINCRBY', KEYS[2], 'processed', done)
end
return out
