-- One task flush for one shard, atomically (invariant 3: a task's work for a source id
-- reaches Redis as one delta, never a partial subset).
-- ARGV: token, interval_ms, buckets, max_replays (-1: each record's own budget), persists,
--       xors, fails, local_completed, records
--   persists: repeated [delta 8][source id 8][len u32]  (a record born in the flushing
--             task; the delta includes its init, i.e. the XOR of its root current id; a
--             zero delta means the record is only stored, to be failed by this same call)
--   records:  their stored records (serialization/stored.py) end to end, len bytes each;
--             a run of them going to one bucket is appended with one string made
--   xors:     repeated [source id 8][delta hi i4][delta lo i4]
--   fails:    as parse_fails in core/failures.lua
-- A token already seen means a retry of a call that did apply: nothing is done twice.
-- Returns {completed, replayed, dead_lettered, orphans, the dead-lettered source ids (8
-- bytes each, end to end)} for this call.
--
-- Entries are read once per bucket (one GET), changed in order in the cache (a source id
-- given twice sees its first change), and written once per bucket (see commit in
-- core/buckets.lua).

local token_key = PREFIX .. ':flush:' .. ARGV[1]
if not redis.call('SET', token_key, '1', 'NX', 'PX', FLUSH_TOKEN_TTL_MS) then
  return {-1, 0, 0, 0, ''}
end
local deadline = deadline_for(tonumber(ARGV[2]), tonumber(ARGV[3]))
local max_replays = tonumber(ARGV[4])
local persists, xors, fails, records = ARGV[5], ARGV[6], ARGV[7], ARGV[9]
-- ARGV[10] (optional): hold_until, ms: when the fails with reason 'held' may be claimed
local done = {0, 0, 0, 0}

-- the changes, in order, as parallel arrays (no table per change): bucket, slot, delta
-- hi, delta lo, source (persists only, else false), frame offset (persists only)
local op_b, op_slot, op_hi, op_lo, op_src, op_off = {}, {}, {}, {}, {}, {}
local nops = 0
local function add(b, slot, dhi, dlo, source, off)
  nops = nops + 1
  op_b[nops], op_slot[nops], op_hi[nops], op_lo[nops] = b, slot, dhi, dlo
  op_src[nops], op_off[nops] = source, off
end

local born = 0
local pos, n, rpos = 1, #persists, 1
local run_b, run_start, run_base = nil, 1, 0 -- consecutive records of one bucket
while pos <= n do
  local dhi, dlo, hi, slot, lo, flen
  dhi, dlo, hi, slot, lo, flen, pos = sunpack(PERSIST_HEAD, persists, pos)
  local b = bucket(hi, lo)
  if b ~= run_b then
    if run_b then add_frame(run_b, ssub(records, run_start, rpos - 1)) end
    run_b, run_start, run_base = b, rpos, frames_end(b)
  end
  local source = source_of(records, rpos - 1)
  add(b, slot, dhi, dlo, source, run_base + rpos - run_start)
  rpos = rpos + flen
  count(pending_name(source))
  born = born + 1
end
if run_b then add_frame(run_b, ssub(records, run_start, rpos - 1)) end
pos, n = 1, #xors
local bhi, blo, b = -1, -1, nil
while pos <= n do
  local hi, slot, lo, dhi, dlo
  hi, slot, lo, dhi, dlo, pos = sunpack(XOR, xors, pos)
  if hi ~= bhi or lo ~= blo then
    bhi, blo, b = hi, lo, bucket(hi, lo)
  end
  add(b, slot, dhi, dlo, false, 0)
end

local function apply(b, slot, dhi, dlo, source, off)
  local hi, lo, dl, inited, foff, src_index = dhi, dlo, 0, 0, NOFRAME, UNKNOWN_SOURCE
  local ehi, elo, edl, einited, eoff, esrc = get(b, slot)
  if ehi then
    hi, lo = bxor(ehi, dhi), bxor(elo, dlo)
    dl, inited, foff, src_index = edl, einited, eoff, esrc
  end
  if source then
    foff = off
    if dhi == 0 and dlo == 0 then
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
for i = 1, nops do apply(op_b[i], op_slot[i], op_hi[i], op_lo[i], op_src[i], op_off[i]) end
count('persisted', born + tonumber(ARGV[8]))
count('completed_local', tonumber(ARGV[8]))

local failed = fail_records(parse_fails(fails, max_replays), tonumber(ARGV[10] or '0'))
done[2], done[3], done[4] = failed[1], failed[2], done[4] + failed[3]
commit_failures()
flush_counts()
done[5] = table.concat(dead_ids)
return done
