-- One task flush for one shard, atomically (invariant 3: a task's work for a source id
-- reaches Redis as one delta, never a partial subset).
-- ARGV: token, interval_ms, buckets, max_replays (-1: each record's own budget), persists,
--       xors, fails, local_completed
--   persists: repeated [delta 8][frame_len u32][frame]  (record born in the flushing task;
--             the delta includes its init, i.e. the XOR of its root current id; a zero
--             delta means the record is only stored, to be failed by this same call)
--   xors:     repeated [source id 8][delta hi i4][delta lo i4]
--   fails:    as parse_fails in _common.lua
-- A token already seen means a retry of a call that did apply: nothing is done twice.
-- Returns {completed, replayed, dead_lettered, orphans} for this call.
--
-- Entries are read once per bucket (one HMGET for every slot the call touches), changed
-- in order in the cache (a source id given twice sees its first change), and written once
-- per bucket (see commit in _common.lua).

local token_key = PREFIX .. ':flush:' .. ARGV[1]
if not redis.call('SET', token_key, '1', 'NX', 'PX', FLUSH_TOKEN_TTL_MS) then
  return {-1, 0, 0, 0}
end
local deadline = deadline_for(tonumber(ARGV[2]), tonumber(ARGV[3]))
local max_replays = tonumber(ARGV[4])
local persists, xors, fails = ARGV[5], ARGV[6], ARGV[7]
local done = {0, 0, 0, 0}

-- the changes, in order: bucket, slot, delta hi, delta lo, source (persists only), frame
-- offset (persists only), stored-only (a persist with a zero delta)
local ops, wanted = {}, {}
local function want(b, slot)
  local list = wanted[b]
  if not list then
    list = {}
    wanted[b] = list
  end
  list[#list + 1] = slot
end

local born = 0
local pos, n = 1, #persists
while pos <= n do
  local dhi, dlo, flen
  dhi, dlo, flen, pos = struct.unpack('>i4i4I4', persists, pos)
  local frame = string.sub(persists, pos, pos + flen - 1)
  pos = pos + flen
  local base, slot = split_id(string.sub(frame, 9, 16))
  local b = bucket(base)
  local source = source_of(frame)
  want(b, slot)
  ops[#ops + 1] = {b, slot, dhi, dlo, source, add_frame(b, frame), dhi == 0 and dlo == 0}
  count(pending_name(source))
  born = born + 1
end
pos, n = 1, #xors
while pos <= n do
  local src, dhi, dlo
  src, dhi, dlo, pos = struct.unpack('>c8i4i4', xors, pos)
  local base, slot = split_id(src)
  local b = bucket(base)
  want(b, slot)
  ops[#ops + 1] = {b, slot, dhi, dlo}
end
for b, slots in pairs(wanted) do load(b, slots) end

local function apply(b, slot, dhi, dlo, source, off, stored_only)
  local v = b.e[slot]
  local hi, lo, dl, inited, foff, src_index = dhi, dlo, 0, 0, NOFRAME, UNKNOWN_SOURCE
  if v then
    local ehi, elo
    ehi, elo, dl, inited, foff, src_index = struct.unpack(ENTRY, v)
    hi, lo = bit.bxor(ehi, dhi), bit.bxor(elo, dlo)
  end
  if source then
    foff = off
    if stored_only then
      -- failed by this same call: the entry only holds the frame for fail_records
      if src_index == UNKNOWN_SOURCE then src_index = source end
      put(b, slot, hi, lo, dl, inited, foff, src_index)
      return
    end
    if inited == 0 then
      inited, src_index, dl = NOW, source, 0 -- a fresh timeout (an orphan's is replaced)
    end
  end
  if hi == 0 and lo == 0 then
    remove(b, slot)
    if inited > 0 then
      -- completion (invariant 4): the entry goes in this same call, counted; its frame
      -- goes with the bucket's last entry
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
    add_timeout(b, dl)
  end
  put(b, slot, hi, lo, dl, inited, foff, src_index)
end
for _, op in ipairs(ops) do apply(op[1], op[2], op[3], op[4], op[5], op[6], op[7]) end
count('persisted', born + tonumber(ARGV[8]))
count('completed_local', tonumber(ARGV[8]))

local failed = fail_records(parse_fails(fails, max_replays))
done[2], done[3], done[4] = failed[1], failed[2], done[4] + failed[3]
commit_failures()
flush_counts()
return done
