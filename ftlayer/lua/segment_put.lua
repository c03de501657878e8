-- A source task of a vectorized batch stores its task summary and indexes its segment
-- (the batch's fresh rows of one partition, Arrow IPC), which the same round trip has
-- just stored with a plain SET and a TTL (a large value never passes through Lua).
-- ARGV: member (source:batch:partition:token), has segment ('1' or ''), summary key
--       suffix, summary ('': none), interval_ms, buckets, summary_ttl_ms, run salt,
--       batch prefix (source:batch:)
-- The indexed segment loses its TTL and gets a deadline: if its batch never settles it,
-- the sidecar fails all of its rows with reason 'timeout' (they replay). A segment of a
-- batch this run settled already (a late speculative or zombie attempt) is dropped, and
-- so is its summary.
-- Returns 1 indexed, 0 not.

local member = ARGV[1]
local settled = batch_settled(ARGV[9], ARGV[8])
if ARGV[4] ~= '' and not settled then
  put_summary(ARGV[3], ARGV[4], tonumber(ARGV[7]), ARGV[9])
end
if ARGV[2] == '' then return 0 end
local key = PREFIX .. ':seg:' .. member
if settled then
  redis.call('DEL', key)
  return 0
end
if redis.call('PERSIST', key) == 0 and redis.call('EXISTS', key) == 0 then
  return redis.error_reply('segment ' .. member .. ' vanished before it was indexed')
end
redis.call('ZADD', PREFIX .. ':segidx',
           deadline_for(tonumber(ARGV[5]), tonumber(ARGV[6])), member)
return 1
