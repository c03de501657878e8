-- Take up to ARGV[2] replays of source ARGV[1] off this shard's queue for a source task.
-- ARGV: source, count, current ids (count x 8 bytes), interval_ms, buckets, token.
-- The token names this claim: what it took is kept under it for CLAIM_TOKEN_TTL_MS (22
-- bytes a record, not the frames), and a call with a token already seen (a retry after a
-- lost reply) returns the same records again instead of popping more (which would strand
-- the first ones until they time out).
-- Each claimed record is inited here with the current id it will be emitted with, and
-- gets a fresh timeout: if the claiming task dies, the record times out and is replayed
-- again (nothing lost); while it only waits in the queue it burns no attempt.
-- Returns a flat list: source id, frame, original partition, failed attempts, source id,
-- ... (frames carry the claimed current id; the source id is the queue's, so a record
-- whose frame no longer decodes can still be dead-lettered on its own by the caller).
-- Redis is called per bucket (one HMGET, one GET of its frames, one HSET), not per record.

local token_key = PREFIX .. ':claim:' .. ARGV[6]
local source, want, curs = ARGV[1], tonumber(ARGV[2]), ARGV[3]

-- the entries of queue items, loaded bucket by bucket
local function load_items(items)
  local by_bucket, where = {}, {}
  for i, item in ipairs(items) do
    local base, slot = split_id(string.sub(item, 1, 8))
    local b = bucket(base)
    where[i] = {b, slot}
    local slots = by_bucket[b]
    if not slots then
      slots = {}
      by_bucket[b] = slots
    end
    slots[#slots + 1] = slot
  end
  for b, slots in pairs(by_bucket) do load(b, slots) end
  return where
end

local function reply_of(out, item, frame, cur)
  out[#out + 1] = string.sub(item, 1, 8)
  out[#out + 1] = string.sub(frame, 1, 16) .. cur .. string.sub(frame, 25)
  out[#out + 1] = (struct.unpack('>i4', item, 13))
  local attempts = 0
  if #item >= 18 then attempts = (struct.unpack('>I2', item, 17)) end
  out[#out + 1] = attempts
end

-- A retry of a claim already made: its reply again, rebuilt from what the first call kept
-- (each record's queue entry, in order, and the position of its current id in ARGV[3]).
local seen = redis.call('GET', token_key)
if seen then
  local items, idx = {}, {}
  for pos = 1, #seen, 22 do
    items[#items + 1] = string.sub(seen, pos, pos + 17)
    idx[#idx + 1] = struct.unpack('>I4', seen, pos + 18)
  end
  local where = load_items(items)
  local out = {}
  for k, item in ipairs(items) do
    local b, slot = where[k][1], where[k][2]
    local v = b.e[slot]
    if v then
      local _, _, _, _, off = struct.unpack(ENTRY, v)
      local frame = off ~= NOFRAME and frame_at(b, off)
      if frame then
        local i = idx[k]
        reply_of(out, item, frame, string.sub(curs, (i - 1) * 8 + 1, i * 8))
      end
    end
  end
  return out
end

local deadline = deadline_for(tonumber(ARGV[4]), tonumber(ARGV[5]))
local items = redis.call('LPOP', PREFIX .. ':replay:' .. source, want)
local out = {}
if not items then
  redis.call('SET', token_key, '', 'PX', CLAIM_TOKEN_TTL_MS)
  return out
end
local kept = {} -- per claimed record: its queue entry (18 bytes) and its index in curs
local vanished = 0
local where = load_items(items)
for i, item in ipairs(items) do
  local b, slot = where[i][1], where[i][2]
  local v = b.e[slot]
  local frame = nil
  local off, src_index
  if v then
    off, src_index = select(5, struct.unpack(ENTRY, v))
    if off ~= NOFRAME then frame = frame_at(b, off) end
  end
  if frame then
    local cur = string.sub(curs, (i - 1) * 8 + 1, i * 8)
    local chi, clo = struct.unpack('>i4i4', cur)
    put(b, slot, chi, clo, deadline, NOW, off, src_index)
    add_timeout(b, deadline)
    reply_of(out, item, frame, cur)
    local e = item
    if #e < 18 then e = e .. string.rep('\0', 18 - #e) end
    kept[#kept + 1] = e .. struct.pack('>I4', i)
  else
    vanished = vanished + 1
  end
end
commit()
count('replays_vanished', vanished)
count('replays_claimed', #out / 4)
flush_counts()
redis.call('SET', token_key, table.concat(kept), 'PX', CLAIM_TOKEN_TTL_MS)
return out
