-- core/call.lua -- the state of one call, last of the core. Every call starts with
-- ``begin(KEYS)`` (ftlayer/scripts.py puts it before each script's body). Run by EVAL the
-- core is built anew for each call; in a Redis 7 function library it is built once, at
-- FUNCTION LOAD, and its locals outlive a call. Invariant: every top-level local of the
-- core that holds a call's state is set here, and every other one is an UPPER_CASE
-- constant or a function (tests/test_scripts.py checks it).
local function begin(keys)
  sunpack, spack, ssub, schar = struct.unpack, struct.pack, string.sub, string.char
  bxor = bit.bxor
  STATS, TIDX, DLQ = keys[1], keys[2], keys[3]
  PREFIX = string.sub(STATS, 1, -7)
  local clock = redis.call('TIME')
  NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  NOW_US = clock[1] .. clock[2]
  counts, lat_n, lat_sum, lat_hits, pending_names = {}, 0, 0, {}, {}
  bucket_cache, tmo_add = {}, {}
  copy = {dst = false, src = false, s = 0, e = 0}
  alloc = {b = nil, slot = BUCKET_SLOTS, n = 0, bytes = 0, cap = 0}
  dlq_set, queues, dead_ids, dlq_index = {}, {}, {}, {}
  first_failures, queue_names, later = {}, {}, {}
end
