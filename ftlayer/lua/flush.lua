-- One task flush for one shard, atomically (invariant 3: a task's work for a source id
-- reaches Redis as one delta, never a partial subset).
-- ARGV: token, interval_ms, buckets, max_replays (-1: each record's own budget), persists,
--       xors, fails, local_completed
--   persists: repeated [delta 8][frame_len u32][frame]  (record born in the flushing task;
--             the delta includes its init, i.e. the XOR of its root current id; a zero
--             delta means the record is only stored, to be failed by this same call)
--   xors:     repeated [source id 8][delta hi i4][delta lo i4]
--   fails:    as fail_packed in _common.lua
-- A token already seen means a retry of a call that did apply: nothing is done twice.
-- Returns {completed, replayed, dead_lettered, orphans} for this call.

local token_key = PREFIX .. ':flush:' .. ARGV[1]
if not redis.call('SET', token_key, '1', 'NX', 'PX', FLUSH_TOKEN_TTL_MS) then
  return {-1, 0, 0, 0}
end
local interval_ms, buckets = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_replays = tonumber(ARGV[4])
local persists, xors, fails = ARGV[5], ARGV[6], ARGV[7]
local deadline = deadline_for(interval_ms, buckets)
local done = {0, 0, 0, 0}

-- Redis commands are issued in bulk (one HMGET / HSET / HDEL / SADD / SREM per up to
-- CHUNK arguments, not one per entry): the per-command cost of redis.call dominated.
-- Writes are buffered in the order: HSET rec, HSET acks, SADD tmo, then HDEL acks, rec,
-- hist, SREM tmo. Each source id is touched once per call (the handler sends one delta
-- per id); should one come again, the buffers are drained first and its entry is read
-- afresh, so the result is exactly that of applying the entries one by one.
local CHUNK = 1000 -- arguments per bulk command (even: HSET pairs stay whole)
local rec_set, acks_set, acks_del, rec_del = {}, {}, {}, {}
local tmo_add, tmo_del = {}, {} -- deadline -> list of ids
local touched = {} -- ids applied in this call: their prefetched entries may be stale
local tmo_keys = {}
local function tmo_key_of(dl)
  local key = tmo_keys[dl]
  if not key then
    key = tmo_key(dl)
    tmo_keys[dl] = key
  end
  return key
end
local pending_names = {}
local function pending_name(source)
  local name = pending_names[source]
  if not name then
    name = 'pending:' .. source
    pending_names[source] = name
  end
  return name
end

local function bulk(cmd, key, args)
  local n = #args
  for i = 1, n, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, n)))
  end
end

local function push(map, dl, src)
  local list = map[dl]
  if not list then
    list = {}
    map[dl] = list
  end
  list[#list + 1] = src
end

local function drain()
  bulk('HSET', REC, rec_set)
  bulk('HSET', ACKS, acks_set)
  for dl, srcs in pairs(tmo_add) do
    bulk('SADD', tmo_key_of(dl), srcs)
    if not indexed[dl] then
      redis.call('ZADD', TIDX, dl, string.format('%d', dl))
      indexed[dl] = true
    end
  end
  bulk('HDEL', ACKS, acks_del)
  bulk('HDEL', REC, rec_del)
  bulk('HDEL', HIST, rec_del)
  for dl, srcs in pairs(tmo_del) do bulk('SREM', tmo_key_of(dl), srcs) end
  rec_set, acks_set, acks_del, rec_del, tmo_add, tmo_del = {}, {}, {}, {}, {}, {}
end

-- the current entries of a list of ids, one HMGET per CHUNK ids
local function read_entries(srcs)
  local out, n = {}, #srcs
  for i = 1, n, CHUNK do
    local got = redis.call('HMGET', ACKS, unpack(srcs, i, math.min(i + CHUNK - 1, n)))
    for j = 1, #got do out[i + j - 1] = got[j] end
  end
  return out
end

-- XOR a delta into src's entry (``entry``: its value read before this call touched it);
-- init = the source's init is part of it (then source >= 0).
local function apply(src, dhi, dlo, source, entry)
  if touched[src] then
    drain()
    entry = redis.call('HGET', ACKS, src)
  end
  touched[src] = true
  local hi, lo, dl, inited, src_index = dhi, dlo, 0, 0, UNKNOWN_SOURCE
  if entry then
    local ehi, elo
    ehi, elo, dl, inited, src_index = struct.unpack(ENTRY, entry)
    hi, lo = bit.bxor(ehi, dhi), bit.bxor(elo, dlo)
  end
  if source then
    if inited == 0 then
      inited, src_index = NOW, source
      if dl ~= deadline then
        if dl > 0 then push(tmo_del, dl, src) end
        dl = 0
      end
    end
  end
  if hi == 0 and lo == 0 then
    if entry then acks_del[#acks_del + 1] = src end
    if dl > 0 then push(tmo_del, dl, src) end
    if inited > 0 then
      -- completion (invariant 4): the ack entry, the
      -- record, its history and its timeout entry go in this same call, counted
      rec_del[#rec_del + 1] = src
      count('completed')
      count(pending_name(src_index), -1)
      observe_latency(NOW - inited)
      done[1] = done[1] + 1
    else
      -- late XORs of a retired id that cancelled out: garbage, collect it now
      count('orphans')
      done[4] = done[4] + 1
    end
    return
  end
  if dl == 0 then
    -- a new entry: inited ones time out as records, uninited ones as orphans
    dl = deadline
    push(tmo_add, dl, src)
  end
  acks_set[#acks_set + 1] = src
  acks_set[#acks_set + 1] = struct.pack(ENTRY, hi, lo, dl, inited, src_index)
end

-- persists, up to CHUNK records at a time: parse, read their entries in one HMGET, apply.
-- A record whose id this call touched already (never from the handler) starts a new chunk
-- after a drain, so its frame is written after everything before it was applied.
local born = 0
local srcs, dhis, dlos, sources, seen = {}, {}, {}, {}, {}
local function apply_persists()
  if #srcs > 0 then
    local entries = read_entries(srcs)
    for i = 1, #srcs do apply(srcs[i], dhis[i], dlos[i], sources[i], entries[i]) end
  end
  srcs, dhis, dlos, sources, seen = {}, {}, {}, {}, {}
end
local pos, n = 1, #persists
while pos <= n do
  local dhi, dlo, flen
  dhi, dlo, flen, pos = struct.unpack('>i4i4I4', persists, pos)
  local frame = string.sub(persists, pos, pos + flen - 1)
  pos = pos + flen
  local src = string.sub(frame, 9, 16)
  local source = source_of(frame)
  if seen[src] or touched[src] or #srcs >= CHUNK then
    apply_persists()
    if touched[src] then drain() end
  end
  seen[src] = true
  rec_set[#rec_set + 1] = src
  rec_set[#rec_set + 1] = frame
  count(pending_name(source))
  born = born + 1
  if dhi ~= 0 or dlo ~= 0 then
    local k = #srcs + 1
    srcs[k], dhis[k], dlos[k], sources[k] = src, dhi, dlo, source
  end
end
apply_persists()
count('persisted', born + tonumber(ARGV[8]))
count('completed_local', tonumber(ARGV[8]))

pos, n = 1, #xors
while pos <= n do
  local srcs, dhis, dlos = {}, {}, {}
  local stop = math.min(n, pos + CHUNK * 16 - 1)
  while pos <= stop do
    local k = #srcs + 1
    srcs[k], dhis[k], dlos[k], pos = struct.unpack('>c8i4i4', xors, pos)
  end
  local entries = read_entries(srcs)
  for i = 1, #srcs do apply(srcs[i], dhis[i], dlos[i], nil, entries[i]) end
end
drain()

local failed = fail_packed(fails, max_replays)
done[2], done[3], done[4] = failed[1], failed[2], done[4] + failed[3]

flush_counts()
return done
