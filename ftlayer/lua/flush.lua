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
if not redis.call('SET', token_key, '1', 'NX', 'PX', 600000) then
  return {-1, 0, 0, 0}
end
local interval_ms, buckets = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_replays = tonumber(ARGV[4])
local persists, xors, fails = ARGV[5], ARGV[6], ARGV[7]
local deadline = deadline_for(interval_ms, buckets)
local done = {0, 0, 0, 0}

-- XOR a delta into src's entry; init = the source's init is part of it (then source >= 0)
local function apply(src, dhi, dlo, source)
  local entry = redis.call('HGET', ACKS, src)
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
        remove_timeout(src, dl)
        dl = 0
      end
    end
  end
  if hi == 0 and lo == 0 then
    if inited > 0 then
      complete(src, dl, inited, src_index)
      done[1] = done[1] + 1
    else
      -- late XORs of a retired id that cancelled out: garbage, collect it now
      redis.call('HDEL', ACKS, src)
      remove_timeout(src, dl)
      count('orphans')
      done[4] = done[4] + 1
    end
    return
  end
  if dl == 0 then
    -- a new entry: inited ones time out as records, uninited ones as orphans
    dl = deadline
    add_timeout(src, dl)
  end
  redis.call('HSET', ACKS, src, struct.pack(ENTRY, hi, lo, dl, inited, src_index))
end

local pos, n = 1, #persists
local born = 0
while pos <= n do
  local dhi, dlo, flen
  dhi, dlo, flen, pos = struct.unpack('>i4i4I4', persists, pos)
  local frame = string.sub(persists, pos, pos + flen - 1)
  pos = pos + flen
  local src = string.sub(frame, 9, 16)
  local source = source_of(frame)
  redis.call('HSET', REC, src, frame)
  count('pending:' .. source)
  born = born + 1
  if dhi ~= 0 or dlo ~= 0 then apply(src, dhi, dlo, source) end
end
count('persisted', born + tonumber(ARGV[8]))
count('completed_local', tonumber(ARGV[8]))

pos, n = 1, #xors
while pos <= n do
  local src, dhi, dlo
  src, dhi, dlo, pos = struct.unpack('>c8i4i4', xors, pos)
  apply(src, dhi, dlo, nil)
end

local failed = fail_packed(fails, max_replays)
done[2], done[3], done[4] = failed[1], failed[2], done[4] + failed[3]

flush_counts()
return done
