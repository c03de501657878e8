-- Before a batch runs: drop the segments an earlier run of the same batch id left (a
-- batch Spark re-runs after a driver crash replaces its segments, never replays them).
-- ARGV: member prefix (source:batch:). Returns how many were dropped.

local prefix = ARGV[1]
local idx = PREFIX .. ':segidx'
local dropped = 0
for _, member in ipairs(redis.call('ZRANGE', idx, 0, -1)) do
  if string.sub(member, 1, #prefix) == prefix then
    redis.call('DEL', PREFIX .. ':seg:' .. member)
    redis.call('ZREM', idx, member)
    dropped = dropped + 1
  end
end
return dropped
