-- One dead letter per record across shards (ftlayer/dlq_merge.py), step 2 of 2: the dead
-- letter held here under ARGV[1], joined into its record's older dead letter in another
-- shard (dlq_join), leaves this shard; its dead-lettering now counts as
-- 'dead_lettered_again', so 'dead_lettered' counts the record once over all shards.
-- Returns 1 when it was dropped, 0 when it was gone already (re-driven, or dropped by an
-- earlier pass).

local src = ARGV[1]
local raw = redis.call('HGET', DLQ, src)
if not raw then return 0 end
redis.call('HDEL', DLQ, src)
local lin = lineage_of(cmsgpack.unpack(raw)[1])
if lin and redis.call('HGET', PREFIX .. ':dlqlin', lin) == src then
  redis.call('HDEL', PREFIX .. ':dlqlin', lin)
end
count('dead_lettered', -1)
count('dead_lettered_again')
flush_counts()
return 1
