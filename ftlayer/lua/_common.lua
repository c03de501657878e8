-- Prelude shared by every ftlayer script (ftlayer/scripts.py prepends it).
--
-- One shard per call: every key lives under the hash tag {ns:k}, so a script touches one
-- slot and runs unchanged on Redis Cluster. KEYS: stats, hist, tmoidx, dlq; the buckets,
-- timeout sets and replay queues are derived from the same prefix.
--
-- Ids travel and are stored as 8 raw big-endian bytes. Lua numbers are doubles, so 64-bit
-- values are handled as two signed 32-bit halves with LuaBitOp (bit.bxor).
--
-- Storage layout (docs/storage-layout.md). A source id's byte 6 (bits 16..23) is its slot
-- in a bucket; the other 7 bytes name the bucket, which holds up to BUCKET_SLOTS records
-- persisted together (ftlayer/ids.py allocates ids that way):
--   :b:<bucket hex>  hash, slot -> ack entry (small: Redis keeps it a listpack)
--   :f:<bucket hex>  string, the bucket's frames end to end (written by APPEND)
--   :t:<deadline>    set of bucket keys holding entries due at that deadline
-- Ack entry, struct ENTRY '>i4i4I6I6I4H':
--   ack value hi, lo | deadline_ms (0: none, a queued replay) | inited_ms (0: init not
--   applied yet) | offset of its frame in the bucket's frames (NOFRAME: none, an entry
--   made by an XOR before its init) | source index (UNKNOWN_SOURCE: unknown)
-- Invariant 2: an entry completes only when its value is 0 AND inited_ms > 0.
-- The frames string of a bucket is deleted with the bucket's last entry.

local STATS, HIST, TIDX, DLQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local PREFIX = string.sub(STATS, 1, -7) -- strip ':stats'
local ENTRY = '>i4i4I6I6I4H'
local NOFRAME = 4294967295
-- MAX_REPLAYS, UNKNOWN_SOURCE, FLUSH_TOKEN_TTL_MS, ... come from ftlayer/limits.py
local LATENCY_BOUNDS_MS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                           60000, 300000}
local CHUNK = 1000 -- arguments per bulk command (even: HSET pairs stay whole)

local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local NOW_US = clock[1] .. clock[2]

local counts = {}
local function count(name, n)
  counts[name] = (counts[name] or 0) + (n or 1)
end

local function flush_counts()
  for name, n in pairs(counts) do
    if n ~= 0 then redis.call('HINCRBY', STATS, name, n) end
  end
  counts = {}
end

local LATENCY_NAMES = {}
for i, bound in ipairs(LATENCY_BOUNDS_MS) do LATENCY_NAMES[i] = 'latency_le_' .. bound end

local function observe_latency(ms)
  count('latency_count')
  count('latency_sum_ms', ms)
  for i = 1, #LATENCY_BOUNDS_MS do
    if ms <= LATENCY_BOUNDS_MS[i] then
      count(LATENCY_NAMES[i])
      return
    end
  end
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

-- Deadline of a record persisted now: the end of the bucket B intervals ahead, so it
-- fails between (B-1)*I = T and B*I = T*B/(B-1) after it was persisted.
local function deadline_for(interval_ms, buckets)
  return (math.floor(NOW / interval_ms) + buckets) * interval_ms
end

local function tmo_key(deadline)
  return PREFIX .. ':t:' .. string.format('%d', deadline)
end

local function source_of(frame)
  return (struct.unpack('>I2', frame, 33))
end

-- The record's replay budget, written into its frame by the pipeline that persisted it;
-- an override >= 0 (a sidecar's --max-replays) replaces it.
local function budget_of(frame, override)
  if override >= 0 then return override end
  return (struct.unpack('>I2', frame, 35))
end

local function frame_len(frames, off)
  return 48 + struct.unpack('>I4', frames, off + 5)
end

-- == buckets: every read and write of ack entries and frames goes through this cache ====
-- A call loads the entries it needs (one HMGET per bucket), changes them in the cache, and
-- writes each bucket once at commit(): frames (APPEND), entries (HSET), removals (HDEL),
-- its timeout sets (SADD), and the frames of a bucket left empty (DEL).
local bucket_cache = {} -- base (7 bytes) -> bucket
local tmo_add = {}     -- deadline -> {bucket key -> true}

local function split_id(src)
  return string.sub(src, 1, 5) .. string.sub(src, 7, 8), string.byte(src, 6)
end

local function id_of(base, slot)
  return string.sub(base, 1, 5) .. string.char(slot) .. string.sub(base, 6, 7)
end

local function bucket(base)
  local b = bucket_cache[base]
  if not b then
    local a, c = struct.unpack('>I4I3', base)
    local hex = string.format('%08x%06x', a, c)
    b = {base = base, key = PREFIX .. ':b:' .. hex, fkey = PREFIX .. ':f:' .. hex,
         e = {}, set = {}, del = {}, app = {}, applen = 0, flen = nil, frames = nil,
         full = false}
    bucket_cache[base] = b
  end
  return b
end

-- The base of a bucket key (':b:<14 hex>').
local function base_of_key(key)
  local hex = string.sub(key, -14)
  return struct.pack('>I4I3', tonumber(string.sub(hex, 1, 8), 16),
                     tonumber(string.sub(hex, 9, 14), 16))
end

-- Read the entries of ``slots`` (a list) of bucket b that are not cached yet.
local function load(b, slots)
  if b.full then return end
  local want, seen = {}, {}
  for _, s in ipairs(slots) do
    if b.e[s] == nil and not seen[s] then
      want[#want + 1] = s
      seen[s] = true
    end
  end
  for i = 1, #want, CHUNK do
    local part = {unpack(want, i, math.min(i + CHUNK - 1, #want))}
    local got = redis.call('HMGET', b.key, unpack(part))
    for j = 1, #part do b.e[part[j]] = got[j] or false end
  end
end

-- Read every entry of bucket b.
local function load_all(b)
  if b.full then return end
  local flat = redis.call('HGETALL', b.key)
  for i = 1, #flat, 2 do
    local s = tonumber(flat[i])
    if b.e[s] == nil then b.e[s] = flat[i + 1] end
  end
  b.full = true
end

local function entry_of(b, slot)
  local v = b.e[slot]
  if v == nil then
    load(b, {slot})
    v = b.e[slot]
  end
  return v
end

local function put(b, slot, hi, lo, dl, inited, off, source)
  b.e[slot] = struct.pack(ENTRY, hi, lo, dl, inited, off, source)
  b.set[slot] = true
  b.del[slot] = nil
end

local function remove(b, slot)
  b.e[slot] = false
  b.set[slot] = nil
  b.del[slot] = true
end

local function add_timeout(b, deadline)
  local set = tmo_add[deadline]
  if not set then
    set = {}
    tmo_add[deadline] = set
  end
  set[b.key] = true
end

-- Append a frame to bucket b's frames (written at commit); returns its offset.
local function add_frame(b, frame)
  if not b.flen then b.flen = redis.call('STRLEN', b.fkey) end
  local off = b.flen + b.applen
  b.app[#b.app + 1] = frame
  b.applen = b.applen + #frame
  return off
end

-- The frame at ``off`` in bucket b (read whole once per call: frames are small and a call
-- that needs one usually needs several).
local function frame_at(b, off)
  if not b.flen then b.flen = redis.call('STRLEN', b.fkey) end
  if off >= b.flen then
    local pending = table.concat(b.app)
    b.app = {pending}
    return string.sub(pending, off - b.flen + 1, off - b.flen + frame_len(pending, off - b.flen))
  end
  if not b.frames then b.frames = redis.call('GET', b.fkey) or '' end
  if off + 48 > #b.frames then return nil end
  return string.sub(b.frames, off + 1, off + frame_len(b.frames, off))
end

local function commit()
  for _, b in pairs(bucket_cache) do
    if b.applen > 0 then
      redis.call('APPEND', b.fkey, table.concat(b.app))
      b.flen = b.flen + b.applen
      b.app, b.applen, b.frames = {}, 0, nil
    end
    local sets, dels = {}, {}
    for s in pairs(b.set) do
      sets[#sets + 1] = s
      sets[#sets + 1] = b.e[s]
    end
    for s in pairs(b.del) do dels[#dels + 1] = s end
    bulk('HSET', b.key, sets)
    if #dels > 0 then
      bulk('HDEL', b.key, dels)
      if #sets == 0 and redis.call('EXISTS', b.key) == 0 then
        redis.call('DEL', b.fkey)
        b.flen, b.frames = nil, nil
      end
    end
    b.set, b.del = {}, {}
  end
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
local alloc = {base = nil, slot = BUCKET_SLOTS, n = 0, bytes = 0}
local function new_source_id(low2, size)
  if alloc.slot >= BUCKET_SLOTS or (alloc.slot > 0 and alloc.bytes + size > BUCKET_MAX_BYTES) then
    repeat
      alloc.n = alloc.n + 1
      local h = redis.sha1hex(PREFIX .. ':' .. NOW_US .. ':' .. alloc.n .. ':' .. low2)
      local top = tonumber(string.sub(h, 1, 10), 16) % 549755813888 -- 2^39: bit 63 clear
      alloc.base = struct.pack('>I5', top) .. low2
    until not bucket_cache[alloc.base] and redis.call('EXISTS', bucket(alloc.base).key) == 0
    alloc.slot, alloc.bytes = 0, 0
  end
  local slot = alloc.slot
  alloc.slot = slot + 1
  alloc.bytes = alloc.bytes + size
  return id_of(alloc.base, slot), bucket(alloc.base), slot
end

-- == failure: replay or dead letter ======================================================
-- Failed attempts since the record was last re-driven out of the dead-letter hash: the
-- attempt number of its newest history entry (an entry may stand for several attempts:
-- replays at the source record only the last one; a 'redrive' mark holds 0).
local function attempts_since_redrive(hist)
  if #hist == 0 then return 0 end
  return hist[#hist][3]
end

-- A replay queue entry: new id | hash code | original partition | failed attempts u16
-- (18 bytes; claim hands the attempts to the stage contexts).
local function queue_entry(new, frame, attempts)
  return new .. string.sub(frame, 25, 32) .. struct.pack('>I2', math.min(attempts, 65535))
end

-- Note a dead letter in this shard's dead-letter log (a capped stream that the drivers'
-- on_dead_letter callbacks read: ftlayer/deadletters.py).
local function log_dead_letter(src, source)
  redis.call('XADD', PREFIX .. ':dlqlog', 'MAXLEN', '~', DLQ_LOG_MAX, '*',
             'src', src, 'source', source)
end

-- Writes of failures, buffered and issued in bulk by commit_failures().
local hist_set, hist_del, dlq_set, queues = {}, {}, {}, {}

-- Store a record under ``id`` (its slot ``slot`` of bucket b) and queue it for replay
-- (it already counts as pending). Its entry holds only the frame: it has no ack value and
-- no timeout until a source task claims it.
local function queue_replay(id, b, slot, frame, hist)
  local source = source_of(frame)
  put(b, slot, 0, 0, 0, 0, add_frame(b, frame), source)
  hist_set[#hist_set + 1] = id
  hist_set[#hist_set + 1] = cmsgpack.pack(hist)
  local q = PREFIX .. ':replay:' .. source
  local items = queues[q]
  if not items then
    items = {}
    queues[q] = items
  end
  items[#items + 1] = queue_entry(id, frame, attempts_since_redrive(hist))
end

-- Queue a failed record for replay under a new source id, in a fresh bucket.
local function requeue(src, frame, hist)
  local new, b, slot = new_source_id(string.sub(src, 7, 8), #frame)
  queue_replay(new, b, slot, string.sub(frame, 1, 8) .. new .. string.sub(frame, 17), hist)
  return new
end

local function dead_letter(src, frame, hist, source)
  dlq_set[#dlq_set + 1] = src
  dlq_set[#dlq_set + 1] = cmsgpack.pack({frame, hist, NOW})
  log_dead_letter(src, source)
  count('dead_lettered')
  count(pending_name(source), -1)
end

local function commit_failures()
  commit()
  bulk('HSET', HIST, hist_set)
  bulk('HDEL', HIST, hist_del)
  bulk('HSET', DLQ, dlq_set)
  for q, items in pairs(queues) do bulk('RPUSH', q, items) end
  hist_set, hist_del, dlq_set, queues = {}, {}, {}, {}
end

-- FTLayer.fail for many records (invariants 5, 6, 8): retire each source id; either
-- re-persist the record under a new source id in the same shard and queue it for replay
-- with its hash code and original partition, or, past its budget, move it to the
-- dead-letter hash with its history. Never acks.
-- list: {src, reason, err, budget} each; budget -1: the record's own (its frame's).
-- Returns {replayed, dead_lettered, orphans}; writes are buffered (commit_failures()).
local function fail_records(list)
  local done = {0, 0, 0}
  local by_bucket = {}
  for i, f in ipairs(list) do
    local base, slot = split_id(f[1])
    local b = bucket(base)
    f.b, f.slot = b, slot
    local slots = by_bucket[b]
    if not slots then
      slots = {}
      by_bucket[b] = slots
    end
    slots[#slots + 1] = slot
    list[i] = f
  end
  for b, slots in pairs(by_bucket) do load(b, slots) end
  local srcs = {}
  for i, f in ipairs(list) do srcs[i] = f[1] end
  local hists = {}
  for i = 1, #srcs, CHUNK do
    local got = redis.call('HMGET', HIST, unpack(srcs, i, math.min(i + CHUNK - 1, #srcs)))
    for j = 1, #got do hists[i + j - 1] = got[j] end
  end
  for i, f in ipairs(list) do
    local src, reason, err, budget, b, slot = f[1], f[2], f[3], f[4], f.b, f.slot
    local v = b.e[slot]
    local frame = nil
    if v then
      local _, _, _, _, off = struct.unpack(ENTRY, v)
      remove(b, slot)
      if off ~= NOFRAME then frame = frame_at(b, off) end
    end
    if not frame then
      count('orphans')
      done[3] = done[3] + 1
    else
      local hist = {}
      if hists[i] then
        hist = cmsgpack.unpack(hists[i])
        hist_del[#hist_del + 1] = src
      end
      local attempt = attempts_since_redrive(hist) + 1
      hist[#hist + 1] = {reason, NOW, attempt, err}
      count('failed_' .. reason)
      if attempt > budget_of(frame, budget) then
        dead_letter(src, frame, hist, source_of(frame))
        done[2] = done[2] + 1
      else
        requeue(src, frame, hist)
        count('replayed')
        done[1] = done[1] + 1
      end
    end
  end
  return done
end

-- Parse a packed list of failures: repeated [source id 8][reason u8: 1 explicit,
-- 2 timeout, 3 explicit and dead-lettered now][err_len u16][err].
local REASONS = {'explicit', 'timeout', 'explicit'}
local function parse_fails(fails, max_replays)
  local list = {}
  local pos, n = 1, #fails
  while pos <= n do
    local src, code, elen
    src, code, elen, pos = struct.unpack('>c8BI2', fails, pos)
    local err = string.sub(fails, pos, pos + elen - 1)
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
