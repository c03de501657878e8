-- The segments of one batch in this shard (members starting with ARGV[1], source:batch:).
-- ARGV[2] = 'drop': before a batch runs, drop what an earlier run of the same batch id
--   left (a batch Spark re-runs replaces its segments, never replays them twice).
-- ARGV[2] = 'touch': while the batch runs, push their deadlines a full timeout ahead
--   (ARGV[3] interval_ms, ARGV[4] buckets), so a long batch is not timed out under a
--   live driver; a driver that dies stops touching and the segments time out.
-- Returns how many segments were dropped or touched.

local prefix, action = ARGV[1], ARGV[2]
local idx = PREFIX .. ':segidx'
local deadline = 0
if action == 'touch' then deadline = deadline_for(tonumber(ARGV[3]), tonumber(ARGV[4])) end
local n = 0
for _, member in ipairs(redis.call('ZRANGE', idx, 0, -1)) do
  if ssub(member, 1, #prefix) == prefix then
    if action == 'drop' then
      redis.call('DEL', PREFIX .. ':seg:' .. member)
      redis.call('ZREM', idx, member)
    else
      redis.call('ZADD', idx, 'XX', deadline, member)
    end
    n = n + 1
  end
end
return n
