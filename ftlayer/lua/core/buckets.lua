-- core/buckets.lua -- the bucket cache: every read and write of ack entries, stored frames
-- and failure histories goes through it, and commit() writes it back.
-- A call reads a bucket's entries once (one GET), changes them in the cache, and writes
-- each bucket once at commit(): frames (APPEND), entries (one SET of the whole string),
-- its timeout sets (SADD), and a bucket left empty goes with its frames (DEL). One string
-- and no hash: Redis reads and writes it whole, where a hash field costs a lookup and a
-- conversion on each side of redis.call.
local bucket_cache -- bucket hi -> bucket lo -> bucket
local tmo_add      -- deadline -> {bucket key -> true}

-- A source id as numbers, without making a string: (bucket hi: bytes 1..5, slot: byte 6,
-- bucket lo: bytes 7..8). Lua strings are interned: each one made costs a hash and a table
-- insert, so the per-record paths work on these numbers.
-- (ID, from ftlayer/wire.py)
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

-- The fields of the stored record at ``off`` of bucket b, read in place (one unpack) when
-- it lies whole in b's frames as read from Redis (read now if not yet): its length (header
-- included), hash code, partition, source index and replay budget; nil when it does not
-- (appended by this call, or cut short).
local function stored_head(b, off)
  if not b.flen then b.flen = redis.call('STRLEN', b.fkey) end
  if off >= b.flen then return nil end
  if not b.frames then b.frames = redis.call('GET', b.fkey) or '' end
  local frames = b.frames
  if off + STORED_HEAD > #frames then return nil end
  local n, hc, part, source, budget = sunpack(STORED_HEAD_FIELDS, frames, off + 1)
  if off + STORED_HEAD + n > #frames then return nil end
  return STORED_HEAD + n, hc, part, source, budget
end

-- Its length alone (the claim's need).
local function stored_len(b, off)
  return (stored_head(b, off))
end

-- commit() in steps, one bucket at a time. The frames appended by this call first (an
-- entry written below may point into them).
local function append_frames(b)
  if b.applen > 0 then
    redis.call('APPEND', b.fkey, table.concat(b.app))
    b.flen = b.flen + b.applen
    b.app, b.applen, b.frames = {}, 0, nil
  end
end

-- Every slot bucket b may hold was removed by this call (no entries string to build).
local function all_removed(b)
  for slot = 0, slots_of(b) - 1 do
    if b.ch[slot] ~= false then return false end
  end
  return true
end

-- Delete bucket b with its frames and histories (its last entry went).
local function drop(b)
  redis.call('DEL', b.key, b.fkey, b.hkey)
  b.ch, b.dirty, b.raw, b.flen, b.frames = {}, false, '', 0, ''
  b.hist, b.hadd, b.hdel = {}, {}, {}
end

-- Bucket b's new entries string: runs of unchanged entries as they were, changed ones
-- packed (removed ones as NO_ENTRY).
local function merged_entries(b)
  local parts, run = {}, nil
  for slot = 0, slots_of(b) - 1 do
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
  return table.concat(parts)
end

-- The last slot of bucket b holding an entry (-1: none). An entry that exists is never
-- all zero: no byte set, no entry (a bucket emptied by an expiry or a completion is found
-- so without reading its slots one by one).
local function last_entry(b)
  if not string.find(b.raw, '[^%z]') then return -1 end
  for slot = #b.raw / ENTRY_BYTES - 1, 0, -1 do
    if get(b, slot) then return slot end
  end
  return -1
end

-- Write bucket b's changed entries: the whole string, trailing empty slots cut; a bucket
-- left empty is deleted with its frames.
local function write_entries(b)
  if not b.dirty then return end
  if all_removed(b) then return drop(b) end
  b.raw = merged_entries(b)
  b.ch, b.dirty = {}, false
  local last = last_entry(b)
  if last < 0 then return drop(b) end
  b.raw = ssub(b.raw, 1, (last + 1) * ENTRY_BYTES)
  redis.call('SET', b.key, b.raw)
end

local function write_histories(b)
  if #b.hadd > 0 then
    bulk('HSET', b.hkey, b.hadd)
    b.hadd = {}
  end
  if #b.hdel > 0 then
    bulk('HDEL', b.hkey, b.hdel)
    b.hdel = {}
  end
end

-- The timeout sets of the deadlines this call gave entries, and their index.
local function write_timeouts()
  for deadline, keys in pairs(tmo_add) do
    local list = {}
    for k in pairs(keys) do list[#list + 1] = k end
    bulk('SADD', tmo_key(deadline), list)
    redis.call('ZADD', TIDX, deadline, string.format('%d', deadline))
  end
  tmo_add = {}
end

-- Write back every bucket this call changed, each once. Invariant 4: a bucket's frames and
-- histories go with its last entry, in the call that removes that entry.
local function commit()
  flush_copy()
  for _, by_lo in pairs(bucket_cache) do for _, b in pairs(by_lo) do
    append_frames(b)
    write_entries(b)
    write_histories(b)
  end end
  write_timeouts()
end
