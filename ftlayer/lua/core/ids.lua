-- core/ids.lua -- new source ids for replays (new_source_id).
-- A replayed record gets a new source id in a fresh bucket of the same shard: the low 16
-- bits (which pick the shard, see ftlayer/ids.py) are those of a record of this shard, the
-- other 40 bits of the bucket come from SHA-1 of the call's clock and a counter
-- (math.random is seeded identically on every call, so it is unusable). A bucket that
-- exists already is never reused; a bucket takes BUCKET_SLOTS records at the most, and
-- records while their frames fit bucket_bytes of its first one. Bit 63 stays clear: it
-- marks batch-local ids of the vectorized path (ftlayer/ids.py).
local alloc -- {b = the fresh bucket, slot = its next slot, n = buckets drawn, bytes, cap}

-- ftlayer.limits.bucket_bytes, the same integers: the frames a bucket takes when its first
-- frame has ``first`` (> 0) bytes: the largest jemalloc size class that BUCKET_SLOTS such
-- frames or fewer fill to within one frame, less STRING_OVERHEAD (four classes per
-- doubling, 2^(e-3) apart in [2^(e-1), 2^e); math.frexp gives e exactly).
local function bucket_bytes(first)
  local want = math.min((BUCKET_SLOTS + 1) * first - 1, BUCKET_MAX_BYTES) + STRING_OVERHEAD
  local _, e = math.frexp(want)
  local step = 2 ^ (e - 3)
  return math.floor(want / step) * step - STRING_OVERHEAD
end

-- Returns the bucket and slot of the new id (id_of makes its 8 bytes).
local function new_source_id(lo, size)
  if alloc.slot >= BUCKET_SLOTS or (alloc.slot > 0 and alloc.bytes + size > alloc.cap) then
    local hi
    repeat
      alloc.n = alloc.n + 1
      local h = redis.sha1hex(PREFIX .. ':' .. NOW_US .. ':' .. alloc.n .. ':' .. lo)
      hi = tonumber(ssub(h, 1, 10), 16) % 549755813888 -- 2^39: bit 63 clear
    until not (bucket_cache[hi] and bucket_cache[hi][lo])
      and redis.call('EXISTS', bucket(hi, lo).key) == 0
    alloc.b, alloc.slot, alloc.bytes, alloc.cap = bucket(hi, lo), 0, 0, bucket_bytes(size)
  end
  local slot = alloc.slot
  alloc.slot = slot + 1
  alloc.bytes = alloc.bytes + size
  return alloc.b, slot
end
