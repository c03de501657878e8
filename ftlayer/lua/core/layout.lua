-- core/layout.lua -- the first part of the core every shard script runs (ftlayer/scripts.py
-- concatenates core/ in the order of CORE: layout, stats, records, buckets, ids, failures,
-- summaries, call, after the constants of ftlayer/limits.py). Owns: the key and storage
-- layout, the ack entry's format, the call's keys and clock, two helpers (bulk, table_at).
-- A part may use what the parts before it define, never what comes after.
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
-- Ack entry, struct ENTRY (ENTRY_BYTES bytes, from ftlayer/wire.py):
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
-- use (two in a function library, whose globals sit behind a metatable). Set by begin():
-- a library's top level cannot read globals. Nothing per-slot is precomputed here (the
-- core is built anew on every EVAL): a history field is schar(slot) when needed.
local sunpack, spack, ssub, schar, bxor -- struct.unpack/pack, string.sub/char, bit.bxor
-- ENTRY, ENTRY_BYTES, NO_ENTRY (ENTRY_BYTES zero bytes, spelled out: a function library's
-- top level cannot call string.rep), NOFRAME, ID, XOR, FAIL_HEAD, REASONS and QUEUE_ENTRY
-- come from ftlayer/wire.py, the one owner of every layout shared with Python
-- MAX_REPLAYS, UNKNOWN_SOURCE, FLUSH_TOKEN_TTL_MS, ... come from ftlayer/limits.py
-- LATENCY_BOUNDS_MS and their counter names LATENCY_NAMES come from ftlayer/limits.py too
local CHUNK = 1000 -- arguments per bulk command (even: HSET pairs stay whole)

local NOW, NOW_US -- the call's clock: ms, and seconds..microseconds digits

local function bulk(cmd, key, args)
  local n = #args
  for i = 1, n, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, n)))
  end
end

-- t[k], made an empty table first if there is none.
local function table_at(t, k)
  local v = t[k]
  if not v then
    v = {}
    t[k] = v
  end
  return v
end
