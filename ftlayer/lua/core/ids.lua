-- core/ids.lua -- new source ids for replays (new_source_id).
-- A replayed record gets a new source id in a fresh bucket of the same shard: the low 16
-- bits (which pick the shard, see ftlayer/ids.py) are those of a record of this shard, the
-- other 40 bits of the bucket come from SHA-1 of the call's clock and a counter
-- (math.random is seeded identically on every call, so it is unusable). A bucket that
-- exists already is never reused; a bucket takes BUCKET_SLOTS records or BUCKET_MAX_BYTES
-- of frames, whichever comes first. Bit 63 stays clear: it marks batch-local ids of the
-- vectorized path (ftlayer/ids.py).
local alloc -- {b = the fresh bucket, slot = its next slot, n = buckets drawn, bytes}
-- Returns the bucket and slot of the new id (id_of makes its 8 bytes).
local function new_source_id(lo, size)
  if alloc.slot >= BUCKET_SLOTS or (alloc.slot > 0 and alloc.bytes + size > BUCKET_MAX_BYTES) then
    local hi
    repeat
      alloc.n = alloc.n + 1
      local h = redis.sha1hex(PREFIX .. ':' .. NOW_US .. ':' .. alloc.n .. ':' .. lo)
      hi = tonumber(ssub(h, 1, 10), 16) % 549755813888 -- 2^39: bit 63 clear
    until not (bucket_cache[hi] and bucket_cache[hi][lo])
      and redis.call('EXISTS', bucket(hi, lo).key) == 0
    alloc.b, alloc.slot, alloc.bytes = bucket(hi, lo), 0, 0
  end
  local slot = alloc.slot
  alloc.slot = slot + 1
  alloc.bytes = alloc.bytes + size
  return alloc.b, slot
end
