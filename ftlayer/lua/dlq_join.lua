-- One dead letter per record across shards (ftlayer/dlq_merge.py), step 1 of 2: the dead
-- letter held here under ARGV[1] is joined by the entry ARGV[3] (packed {frame, history,
-- time}) of the same record, held under ARGV[2] in another shard: the newer frame, both
-- histories, an 'again' mark naming ARGV[2] between them. Idempotent: the mark is looked
-- for first, so a pass repeated after a crash joins nothing twice.
-- Returns 1 when the entry held here holds ARGV[2]'s history now, 0 when it is gone.

local raw = redis.call('HGET', DLQ, ARGV[1])
if not raw then return 0 end
local other = cmsgpack.unpack(ARGV[3])
local entry = joined(raw, ARGV[2], other[1], other[2])
if entry then redis.call('HSET', DLQ, ARGV[1], entry) end
return 1
