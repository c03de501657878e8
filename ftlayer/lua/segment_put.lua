-- A source task of a vectorized batch stores its segment (the batch's fresh rows of one
-- partition, Arrow IPC) and its task summary, in one call.
-- ARGV: member (source:batch:partition:token), segment ('': no fresh rows), summary key
--       suffix, summary ('': none), interval_ms, buckets, summary_ttl_ms, run salt,
--       batch prefix (source:batch:)
-- The segment gets a deadline: if its batch never settles it, the sidecar fails all of
-- its rows with reason 'timeout' (they replay). A segment already settled by this run (a
-- late speculative or zombie attempt) is not stored again. Returns 1 stored, 0 skipped.

local member, seg = ARGV[1], ARGV[2]
if ARGV[4] ~= '' then
  redis.call('SET', PREFIX .. ':sum:' .. ARGV[3], ARGV[4], 'PX', tonumber(ARGV[7]))
end
if seg == '' then return 0 end
if redis.call('GET', PREFIX .. ':segdone:' .. ARGV[9]) == ARGV[8] then return 0 end
redis.call('SET', PREFIX .. ':seg:' .. member, seg)
redis.call('ZADD', PREFIX .. ':segidx',
           deadline_for(tonumber(ARGV[5]), tonumber(ARGV[6])), member)
return 1
