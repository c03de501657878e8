-- Prelude shared by every ftlayer script (ftlayer/scripts.py prepends it).
--
-- One shard per call: every key lives under the hash tag {ns:k}, so a script touches one
-- slot and runs unchanged on Redis Cluster. KEYS: stats, tmoidx, dlq; the buckets, their
-- histories, timeout sets and replay queues are derived from the same prefix.
--
-- Ids travel and are stored as 8 raw big-endian bytes. Lua numbers are doubles, so 64-bit
-- values are handled as two signed 32-bit halves with LuaBitOp (bit.bxor).
--
-- Storage layout (docs/storage-layout.md). A source id's byte 6 (bits 16..23) is its slot
-- in a bucket; the other 7 bytes name the bucket, which holds up to BUCKET_SLOTS records
-- persisted together (ftlayer/ids.py allocates ids that way):
--   :b:<bucket hex>  string, the bucket's ack entries: slot s at byte s*26, all zero: none
--   :f:<bucket hex>  string, the bucket's frames end to end (written by APPEND)
--   :h:<bucket hex>  hash, the failure histories of the bucket's records that have one:
--                    field schar(slot) (the slot as one byte), value the packed
--                    history; deleted with the bucket, so a replayed record that completes
--                    leaves nothing behind
--   :t:<deadline>    set of bucket keys holding entries due at that deadline
-- Ack entry, struct ENTRY '>i4i4I6I6I4H', 26 bytes:
--   ack value hi, lo | deadline_ms (0: none, a queued replay) | inited_ms (0: init not
--   applied yet) | 1 + offset of its frame in the bucket's frames (0: none, an entry made
--   by an XOR before its init) | source index (UNKNOWN_SOURCE: unknown)
-- An entry that exists is never all zero (it has a value, a deadline, an init or a frame).
-- Invariant 2: an entry completes only when its value is 0 AND inited_ms > 0.
-- The frames string and the histories of a bucket are deleted with its last entry.

-- Top-level locals here are of three kinds: UPPER_CASE constants, functions, and the state
-- of one call, declared without a value and set by begin() at the end (see there).
local STATS, TIDX, DLQ, PREFIX -- KEYS[1..3], PREFIX: STATS without ':stats'
-- The library functions used per record, as locals: a global costs a table lookup at each
-- use (two in a function library, whose globals sit behind a metatable: 12 ns a use on
-- Redis 7.0, 6.5 by EVAL). Set by begin(): a library's top level cannot read globals.
-- (A table of the 128 history fields built here cost every EVAL 4.6 us: schar(slot) is one.)
local sunpack, spack, ssub, schar, bxor -- struct.unpack/pack, string.sub/char, bit.bxor
local ENTRY = '>i4i4I6I6I4H'
local ENTRY_BYTES = 26
-- ENTRY_BYTES zero bytes, spelled out: a function library's top level cannot call string.rep
local NO_ENTRY = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
local NOFRAME = 4294967295
-- MAX_REPLAYS, UNKNOWN_SOURCE, FLUSH_TOKEN_TTL_MS, ... come from ftlayer/limits.py
-- LATENCY_BOUNDS_MS and their counter names LATENCY_NAMES come from ftlayer/limits.py too
local CHUNK = 1000 -- arguments per bulk command (even: HSET pairs stay whole)

local NOW, NOW_US -- the call's clock: ms, and seconds..microseconds digits

local counts -- stats counter -> change
local function count(name, n)
  counts[name] = (counts[name] or 0) + (n or 1)
end

-- completions' latencies, folded into the counts by flush_counts (no counter name looked
-- up per completion): how many, their sum, and how many fell in each LATENCY_BOUNDS_MS
local lat_n, lat_sum, lat_hits

local function flush_counts()
  if lat_n > 0 then
    count('latency_count', lat_n)
    count('latency_sum_ms', lat_sum)
    for i, n in pairs(lat_hits) do count(LATENCY_NAMES[i], n) end
    lat_n, lat_sum, lat_hits = 0, 0, {}
  end
  for name, n in pairs(counts) do
    if n ~= 0 then redis.call('HINCRBY', STATS, name, n) end
  end
  counts = {}
end

-- n completions (1 by default) that each took ms
local function observe_latency(ms, n)
  n = n or 1
  lat_n = lat_n + n
  lat_sum = lat_sum + ms * n
  for i = 1, #LATENCY_BOUNDS_MS do
    if ms <= LATENCY_BOUNDS_MS[i] then
      lat_hits[i] = (lat_hits[i] or 0) + n
      return
    end
  end
end

local pending_names
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

-- Deadline of a record persisted now: the end of the bucket B intervals ahead, so it
-- fails between (B-1)*I = T and B*I = T*B/(B-1) after it was persisted.
local function deadline_for(interval_ms, buckets)
  return (math.floor(NOW / interval_ms) + buckets) * interval_ms
end

local function tmo_key(deadline)
  return PREFIX .. ':t:' .. string.format('%d', deadline)
end

-- A stored record (serialization/stored.py): payload_len u32 | hash_code i32 | partition
-- i32 | source u16 | max_replays u16 | checksum u64 | lineage i64 | payload; its header is
-- STORED_HEAD bytes (a constant of the prelude, from Python). Scripts copy a stored record
-- whole, so its lineage id stays with it through every replay and re-drive.
-- The readers below take the stored record at byte ``off`` (0-based, default 0) of a
-- string, so a record inside a bucket's frames is read in place.
local function source_of(frame, off)
  return (sunpack('>I2', frame, (off or 0) + 13))
end

-- The record's replay budget, written into its frame by the pipeline that persisted it;
-- an override >= 0 (a sidecar's --max-replays) replaces it.
local function budget_of(frame, override, off)
  if override >= 0 then return override end
  return (sunpack('>I2', frame, (off or 0) + 15))
end

-- Its hash code, original partition and source index: what its replay queue entry
-- carries, and which queue.
local function queue_fields_of(frame, off)
  local hc, part, source = sunpack('>i4i4I2', frame, (off or 0) + 5)
  return hc, part, source
end

local function frame_len(frames, off)
  return STORED_HEAD + sunpack('>I4', frames, off + 1)
end

-- == buckets: every read and write of ack entries and frames goes through this cache ====
-- A call reads a bucket's entries once (one GET), changes them in the cache, and writes
-- each bucket once at commit(): frames (APPEND), entries (one SET of the whole string),
-- its timeout sets (SADD), and a bucket left empty goes with its frames (DEL). One string
-- and no hash: Redis reads and writes it whole, where a hash field costs a lookup and a
-- conversion on each side of redis.call.
-- t[k], made an empty table first if there is none.
local function table_at(t, k)
  local v = t[k]
  if not v then
    v = {}
    t[k] = v
  end
  return v
end

local bucket_cache -- bucket hi -> bucket lo -> bucket
local tmo_add      -- deadline -> {bucket key -> true}

-- A source id as numbers, without making a string: (bucket hi: bytes 1..5, slot: byte 6,
-- bucket lo: bytes 7..8). Lua strings are interned: each one made costs a hash and a table
-- insert, so the per-record paths work on these numbers.
local ID = '>I5BI2'
local function split_id(src, pos)
  local hi, slot, lo = sunpack(ID, src, pos or 1)
  return hi, slot, lo
end

local function id_of(b, slot)
  return spack(ID, b.hi, slot, b.lo)
end

local function bucket(hi, lo)
  local by_lo = table_at(bucket_cache, hi)
  local b = by_lo[lo]
  if not b then
    local hex = string.format('%010x%04x', hi, lo)
    b = {hi = hi, lo = lo, key = PREFIX .. ':b:' .. hex, fkey = PREFIX .. ':f:' .. hex,
         hkey = PREFIX .. ':h:' .. hex, raw = nil, ch = {}, dirty = false, app = {},
         applen = 0, flen = nil, frames = nil, hist = nil, hadd = {}, hdel = {}}
    by_lo[lo] = b
  end
  return b
end

-- The bucket of a bucket key (':b:<14 hex>').
local function bucket_of_key(key)
  local hex = ssub(key, -14)
  return bucket(tonumber(ssub(hex, 1, 10), 16), tonumber(ssub(hex, 11, 14), 16))
end

local function ensure(b)
  if not b.raw then b.raw = redis.call('GET', b.key) or '' end
end

-- The entry of ``slot`` in bucket b: hi, lo, deadline, inited, frame offset (NOFRAME:
-- none), source; nil when there is none.
local function get(b, slot)
  local v = b.ch[slot]
  local hi, lo, dl, inited, off1, source
  if v == false then return nil end
  if v then
    hi, lo, dl, inited, off1, source = sunpack(ENTRY, v)
  else
    ensure(b)
    local pos = slot * ENTRY_BYTES + 1
    if pos + ENTRY_BYTES - 1 > #b.raw then return nil end
    hi, lo, dl, inited, off1, source = sunpack(ENTRY, b.raw, pos)
  end
  if hi == 0 and lo == 0 and dl == 0 and inited == 0 and off1 == 0 then return nil end
  if off1 == 0 then return hi, lo, dl, inited, NOFRAME, source end
  return hi, lo, dl, inited, off1 - 1, source
end

-- The slots bucket b may hold (its entries string's length / 26, and changed slots).
local function slots_of(b)
  ensure(b)
  local n = #b.raw / ENTRY_BYTES
  for s in pairs(b.ch) do
    if s + 1 > n then n = s + 1 end
  end
  return n
end

local function put(b, slot, hi, lo, dl, inited, off, source)
  local off1 = 0
  if off ~= NOFRAME then off1 = off + 1 end
  b.ch[slot] = spack(ENTRY, hi, lo, dl, inited, off1, source)
  b.dirty = true
end

local function remove(b, slot)
  b.ch[slot] = false
  b.dirty = true
end

local function add_timeout(b, deadline)
  table_at(tmo_add, deadline)[b.key] = true
end

-- The failure histories of bucket b's records (field -> packed history), read once per
-- call (one HGETALL; most buckets have none: an empty reply).
local function histories_of(b)
  local h = b.hist
  if not h then
    h = {}
    local flat = redis.call('HGETALL', b.hkey)
    for j = 1, #flat, 2 do h[flat[j]] = flat[j + 1] end
    b.hist = h
  end
  return h
end

-- Written at commit with the bucket's entries (HSET, HDEL), or gone with it (DEL).
local function set_history(b, slot, packed)
  local field, add = schar(slot), b.hadd
  add[#add + 1] = field
  add[#add + 1] = packed
  if b.hist then b.hist[field] = packed end
end

local function del_history(b, slot)
  b.hdel[#b.hdel + 1] = schar(slot)
end

-- A copy of stored frames pending from one bucket's frames string (src, bytes s..e-1,
-- 0-based) to the end of another's (dst): a run of records failed in order and requeued
-- into consecutive slots of one fresh bucket is copied with one string made. Whatever
-- reads or extends dst's frames writes the pending copy first (flush_copy).
local copy -- {dst = bucket or false, src = bucket, s, e}
local function flush_copy()
  local dst = copy.dst
  if dst then
    copy.dst = false
    local run = ssub(copy.src.frames, copy.s + 1, copy.e)
    dst.app[#dst.app + 1] = run
    dst.applen = dst.applen + #run
  end
end

-- Where the next frame appended to bucket b will start.
local function frames_end(b)
  if copy.dst == b then flush_copy() end
  if not b.flen then b.flen = redis.call('STRLEN', b.fkey) end
  return b.flen + b.applen
end

-- Copy the stored frame at ``off`` (``len`` bytes) of bucket src's frames string (read
-- already) to the end of bucket dst's frames; returns its offset there.
local function copy_frame(dst, src, off, len)
  if copy.dst == dst and copy.src == src and copy.e == off then
    local at = dst.flen + dst.applen + copy.e - copy.s
    copy.e = off + len
    return at
  end
  flush_copy()
  local at = frames_end(dst)
  copy.dst, copy.src, copy.s, copy.e = dst, src, off, off + len
  return at
end

-- Append a frame (or frames end to end) to bucket b's frames (written at commit);
-- returns its offset.
local function add_frame(b, frame)
  local off = frames_end(b)
  b.app[#b.app + 1] = frame
  b.applen = b.applen + #frame
  return off
end

-- The frame at ``off`` in bucket b (read whole once per call: frames are small and a call
-- that needs one usually needs several).
local function frame_at(b, off)
  if copy.dst == b then flush_copy() end
  if not b.flen then b.flen = redis.call('STRLEN', b.fkey) end
  if off >= b.flen then
    local pending = table.concat(b.app)
    b.app = {pending}
    return ssub(pending, off - b.flen + 1, off - b.flen + frame_len(pending, off - b.flen))
  end
  if not b.frames then b.frames = redis.call('GET', b.fkey) or '' end
  if off + STORED_HEAD > #b.frames then return nil end
  return ssub(b.frames, off + 1, off + frame_len(b.frames, off))
end

-- The fields of the stored frame at ``off`` of bucket b, read in place when it lies whole
-- in b's frames as read from Redis (read now if not yet): its length (header included),
-- hash code, partition, source index and replay budget; nil when it does not (appended
-- by this call, or cut short).
local function stored_head(b, off)
  if not b.flen then b.flen = redis.call('STRLEN', b.fkey) end
  if off >= b.flen then return nil end
  if not b.frames then b.frames = redis.call('GET', b.fkey) or '' end
  local frames = b.frames
  if off + STORED_HEAD > #frames then return nil end
  local n, hc, part, source, budget = sunpack('>I4i4i4I2I2', frames, off + 1)
  if off + STORED_HEAD + n > #frames then return nil end
  return STORED_HEAD + n, hc, part, source, budget
end

-- Its length alone (the claim's need).
local function stored_len(b, off)
  return (stored_head(b, off))
end

local function commit()
  flush_copy()
  for _, by_lo in pairs(bucket_cache) do for _, b in pairs(by_lo) do
    if b.applen > 0 then
      redis.call('APPEND', b.fkey, table.concat(b.app))
      b.flen = b.flen + b.applen
      b.app, b.applen, b.frames = {}, 0, nil
    end
    local emptied = b.dirty -- every slot it may hold removed: delete it, no string built
    if emptied then
      for slot = 0, slots_of(b) - 1 do
        if b.ch[slot] ~= false then
          emptied = false
          break
        end
      end
    end
    if emptied then
      redis.call('DEL', b.key, b.fkey, b.hkey)
      b.ch, b.dirty, b.raw, b.flen, b.frames = {}, false, '', 0, ''
      b.hist, b.hadd, b.hdel = {}, {}, {}
    elseif b.dirty then
      -- the new entries string: runs of unchanged entries as they were, changed ones
      -- packed; trailing empty slots cut; an empty bucket deleted with its frames
      local n = slots_of(b)
      local parts, live, run = {}, 0, nil
      for slot = 0, n - 1 do
        local v = b.ch[slot]
        if v == nil then
          if not run then run = slot end
        else
          if run then  -- unchanged slots as they were; past the old end, empty ones
            local kept = ssub(b.raw, run * ENTRY_BYTES + 1, slot * ENTRY_BYTES)
            parts[#parts + 1] = kept
            for _ = #kept / ENTRY_BYTES + 1, slot - run do parts[#parts + 1] = NO_ENTRY end
            run = nil
          end
          parts[#parts + 1] = v or NO_ENTRY
        end
      end
      if run then parts[#parts + 1] = ssub(b.raw, run * ENTRY_BYTES + 1) end
      b.ch, b.dirty = {}, false
      b.raw = table.concat(parts)
      local last = -1
      -- an entry that exists is never all zero: no byte set, no entry (a bucket emptied
      -- by an expiry or a completion is found so without reading its slots one by one)
      if string.find(b.raw, '[^%z]') then
        for slot = #b.raw / ENTRY_BYTES - 1, 0, -1 do
          if get(b, slot) then
            last = slot
            break
          end
        end
      end
      if last < 0 then
        redis.call('DEL', b.key, b.fkey, b.hkey)
        b.raw, b.flen, b.frames = '', 0, ''
        b.hist, b.hadd, b.hdel = {}, {}, {}
      else
        b.raw = ssub(b.raw, 1, (last + 1) * ENTRY_BYTES)
        redis.call('SET', b.key, b.raw)
      end
    end
    if #b.hadd > 0 then
      bulk('HSET', b.hkey, b.hadd)
      b.hadd = {}
    end
    if #b.hdel > 0 then
      bulk('HDEL', b.hkey, b.hdel)
      b.hdel = {}
    end
  end end
  for deadline, keys in pairs(tmo_add) do
    local list = {}
    for k in pairs(keys) do list[#list + 1] = k end
    bulk('SADD', tmo_key(deadline), list)
    redis.call('ZADD', TIDX, deadline, string.format('%d', deadline))
  end
  tmo_add = {}
end

-- == new ids for replays =================================================================
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

-- == failure: replay or dead letter ======================================================
-- Failed attempts since the record was last re-driven out of the dead-letter hash: the
-- attempt number of its newest history entry (an entry may stand for several attempts:
-- replays at the source record only the last one; a 'redrive' mark holds 0).
local function attempts_since_redrive(hist)
  if #hist == 0 then return 0 end
  return hist[#hist][3]
end

-- A replay queue entry, 18 bytes: new id (as split_id reads it: bucket hi, slot, bucket
-- lo) | hash code | original partition | failed attempts (claim hands them to the stage
-- contexts). Made by one spack: no string of the id or of the fields on the way.
local QUEUE_ENTRY = '>I5BI2i4i4I2'

-- Note a dead letter in this shard's dead-letter log (a capped stream that the drivers'
-- on_dead_letter callbacks read: ftlayer/deadletters.py).
local function log_dead_letter(src, source)
  redis.call('XADD', PREFIX .. ':dlqlog', 'MAXLEN', '~', DLQ_LOG_MAX, '*',
             'src', src, 'source', source)
end

local FAILED = {explicit = 'failed_explicit', timeout = 'failed_timeout'}

-- Writes of failures, buffered and issued in bulk by commit_failures() (histories are
-- written with their buckets, by commit()). dead_ids: the source ids this call
-- dead-lettered, in order (returned by the scripts that report them: a driver attributes
-- each to the stage it failed in).
local dlq_set, queues, dead_ids

-- Store a record under ``id`` (its slot ``slot`` of bucket b) and queue it for replay
-- (it already counts as pending). Its entry holds only the frame: it has no ack value and
-- no timeout until a source task claims it.
local first_failures -- reason -> err -> packed one-entry history (memo: a bulk expiry
                     -- fails thousands of records with the same first entry)
local function first_history(reason, err)
  local by_err = table_at(first_failures, reason)
  local packed = by_err[err]
  if not packed then
    packed = cmsgpack.pack({{reason, NOW, 1, err}})
    by_err[err] = packed
  end
  return packed
end

local function packed_history(hist)
  if #hist == 1 and hist[1][3] == 1 then return first_history(hist[1][1], hist[1][4]) end
  return cmsgpack.pack(hist)
end

-- As queue_replay below, with the history packed and its attempts since the last redrive.
local queue_names -- source -> its replay queue's key
-- The entry of a queued record (slot ``slot`` of bucket b, its frame at ``off`` of b's
-- frames already), its history and its queue entry.
local function queue_item(b, slot, off, hc, part, source, packed_hist, attempts)
  put(b, slot, 0, 0, 0, 0, off, source)
  set_history(b, slot, packed_hist)
  local items = queues[source]
  if not items then
    queue_names[source] = PREFIX .. ':replay:' .. source
    items = {}
    queues[source] = items
  end
  if attempts > 65535 then attempts = 65535 end
  items[#items + 1] = spack(QUEUE_ENTRY, b.hi, slot, b.lo, hc, part, attempts)
end

local function queue_packed(b, slot, frame, packed_hist, attempts)
  local hc, part, source = queue_fields_of(frame)
  queue_item(b, slot, add_frame(b, frame), hc, part, source, packed_hist, attempts)
end

-- Queue ``frame`` for replay as the record of slot ``slot`` of bucket b.
local function queue_replay(b, slot, frame, hist)
  queue_packed(b, slot, frame, packed_history(hist), attempts_since_redrive(hist))
end

-- Queue a failed record for replay under a new source id, in a fresh bucket of the shard
-- whose low id bits are ``lo``. Its stored form is copied as it is: it holds no ids (the
-- entry's place names the record).
local function requeue(frame, hist, lo)
  local b, slot = new_source_id(lo, #frame)
  queue_replay(b, slot, frame, hist)
end

-- requeue of a record at its first failure (no history yet): no table made for it.
local function requeue_first(frame, reason, err, lo)
  local b, slot = new_source_id(lo, #frame)
  queue_packed(b, slot, frame, first_history(reason, err), 1)
end

-- The same for the stored frame at ``off`` (``len`` bytes; its fields read already) of
-- bucket src's frames string, copied without making a string of it.
local function requeue_first_at(src, off, len, hc, part, source, reason, err)
  local b, slot = new_source_id(src.lo, len)
  queue_item(b, slot, copy_frame(b, src, off, len), hc, part, source,
             first_history(reason, err), 1)
end

-- pending: it counted as pending until now (a vectorized batch's residue did not).
local function dead_letter(src, frame, hist, source, pending)
  dlq_set[#dlq_set + 1] = src
  dead_ids[#dead_ids + 1] = src
  dlq_set[#dlq_set + 1] = cmsgpack.pack({frame, hist, NOW})
  log_dead_letter(src, source)
  count('dead_lettered')
  if pending then count(pending_name(source), -1) end
end

local function commit_failures()
  commit()
  bulk('HSET', DLQ, dlq_set)
  for source, items in pairs(queues) do bulk('RPUSH', queue_names[source], items) end
  dlq_set, queues = {}, {}
end

-- FTLayer.fail for many records (invariants 5, 6, 8): retire each source id; either
-- re-persist the record under a new source id in the same shard and queue it for replay
-- with its hash code and original partition, or, past its budget, move it to the
-- dead-letter hash with its history. Never acks.
-- Parallel arrays, one index per record: srcs (8-byte ids, or false: made from the bucket
-- and slot if a dead letter needs it), bs and slots (its bucket and
-- slot), offs (its frame's offset if the caller read its entry already, else false: then
-- the entry is looked up; each such src must appear once); reason, err and budget either
-- arrays or one value for all (budget -1: the record's own, from its frame).
-- Returns {replayed, dead_lettered, orphans}; writes are buffered (commit_failures()).
local function fail_many(srcs, bs, slots, offs, reason, err, budget)
  local done = {0, 0, 0}
  local rs, es, bud = type(reason) == 'table', type(err) == 'table', type(budget) == 'table'
  for i = 1, #srcs do
    local src, b, slot, off = srcs[i], bs[i], slots[i], offs[i]
    local r, e, bu = reason, err, budget
    if rs then r = reason[i] end
    if es then e = err[i] end
    if bud then bu = budget[i] end
    local frame, flen, hc, part, source, own = nil, nil, nil, nil, nil, nil
    if not off then
      local hi, _, _, _, o = get(b, slot)
      if hi then off = o end
    end
    if off then
      remove(b, slot)
      if off ~= NOFRAME then
        -- whole in the stored frames: read in place, copied without a string
        flen, hc, part, source, own = stored_head(b, off)
        if not flen then frame = frame_at(b, off) end
      end
    end
    if not frame and not flen then
      count('orphans')
      done[3] = done[3] + 1
    else
      if rs then count(FAILED[r] or ('failed_' .. r)) end
      local packed = histories_of(b)[schar(slot)]
      local first = false -- the common case: a first failure within the budget
      if not packed then
        if not flen then first = budget_of(frame, bu) >= 1
        elseif bu >= 0 then first = bu >= 1
        else first = own >= 1 end
      end
      if first and flen then
        requeue_first_at(b, off, flen, hc, part, source, r, e)
        done[1] = done[1] + 1
      elseif first then
        requeue_first(frame, r, e, b.lo)
        done[1] = done[1] + 1
      else
        if not frame then frame = ssub(b.frames, off + 1, off + flen) end
        local hist = {}
        if packed then
          hist = cmsgpack.unpack(packed)
          del_history(b, slot)
        end
        local attempt = attempts_since_redrive(hist) + 1
        hist[#hist + 1] = {r, NOW, attempt, e}
        if attempt > budget_of(frame, bu) then
          dead_letter(src or id_of(b, slot), frame, hist, source_of(frame), true)
          done[2] = done[2] + 1
        else
          requeue(frame, hist, b.lo)
          done[1] = done[1] + 1
        end
      end
    end
  end
  if done[1] > 0 then count('replayed', done[1]) end
  local failed = #srcs - done[3]
  if not rs and failed > 0 then count(FAILED[reason] or ('failed_' .. reason), failed) end
  return done
end

-- fail_many for a list of {src, reason, err, budget} tables (parse_fails).
local function fail_records(list)
  local srcs, bs, slots, offs, reasons, errs, budgets = {}, {}, {}, {}, {}, {}, {}
  for i, f in ipairs(list) do
    local hi, slot, lo = split_id(f[1])
    srcs[i], bs[i], slots[i], offs[i] = f[1], bucket(hi, lo), slot, false
    reasons[i], errs[i], budgets[i] = f[2], f[3], f[4]
  end
  return fail_many(srcs, bs, slots, offs, reasons, errs, budgets)
end

-- Parse a packed list of failures: repeated [source id 8][reason u8: 1 explicit,
-- 2 timeout, 3 explicit and dead-lettered now][err_len u16][err].
local REASONS = {'explicit', 'timeout', 'explicit'}
local function parse_fails(fails, max_replays)
  local list = {}
  local pos, n = 1, #fails
  while pos <= n do
    local src, code, elen
    src, code, elen, pos = sunpack('>c8BI2', fails, pos)
    local err = ssub(fails, pos, pos + elen - 1)
    pos = pos + elen
    local budget = max_replays
    if code == 3 then budget = 0 end
    list[#list + 1] = {src, REASONS[code] or 'explicit', err, budget}
  end
  return list
end

-- Store a task summary and index its token under its batch (source:batch:), so that the
-- batch's settlement deletes the summaries of every attempt, the losing ones included.
local function put_summary(token, summary, ttl_ms, batch)
  redis.call('SET', PREFIX .. ':sum:' .. token, summary, 'PX', ttl_ms)
  local idx = PREFIX .. ':sumidx:' .. batch
  redis.call('SADD', idx, token)
  redis.call('PEXPIRE', idx, ttl_ms)
end

-- True when this run (its salt) settled the batch already: a late attempt stores nothing.
local function batch_settled(batch, salt)
  return redis.call('GET', PREFIX .. ':segdone:' .. batch) == salt
end

-- == the state of one call ===============================================================
-- Every call starts here (ftlayer/scripts.py puts ``begin(KEYS)`` before each script's
-- body). Run by EVAL the prelude above is built anew for each call; in a Redis 7 function
-- library it is built once, at FUNCTION LOAD, and its locals outlive a call: so every
-- local above that holds a call's state is set here, and nothing else of that kind may
-- exist (tests/test_scripts.py checks that each top-level local that is neither a
-- constant nor a function is set here).
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
  alloc = {b = nil, slot = BUCKET_SLOTS, n = 0, bytes = 0}
  dlq_set, queues, dead_ids = {}, {}, {}
  first_failures, queue_names = {}, {}
end
