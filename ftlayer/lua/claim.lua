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
-- Redis is called in bulk (one HMGET / HSET / SADD per CHUNK records), not per record.

local token_key = PREFIX .. ':claim:' .. ARGV[6]
local source, want, curs = ARGV[1], tonumber(ARGV[2]), ARGV[3]
-- A retry of a claim already made: its reply again, rebuilt from what the first call kept
-- (each record's queue entry, in order, and the position of its current id in ARGV[3]).
local seen = redis.call('GET', token_key)
if seen then
  local out = {}
  for pos = 1, #seen, 22 do
    local entry, i = string.sub(seen, pos, pos + 17), struct.unpack('>I4', seen, pos + 18)
    local src = string.sub(entry, 1, 8)
    local frame = redis.call('HGET', REC, src)
    if frame then
      local cur = string.sub(curs, (i - 1) * 8 + 1, i * 8)
      out[#out + 1] = src
      out[#out + 1] = string.sub(frame, 1, 16) .. cur .. string.sub(frame, 25)
      out[#out + 1] = (struct.unpack('>i4', entry, 13))
      local attempts = 0
      if #entry >= 18 then attempts = (struct.unpack('>I2', entry, 17)) end
      out[#out + 1] = attempts
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
local CHUNK = 1000
local tkey = tmo_key(deadline)
local vanished = 0
for first = 1, #items, CHUNK do
  local last = math.min(first + CHUNK - 1, #items)
  local srcs = {}
  for i = first, last do srcs[#srcs + 1] = string.sub(items[i], 1, 8) end
  local frames = redis.call('HMGET', REC, unpack(srcs))
  local acks, live = {}, {}
  for j, frame in ipairs(frames) do
    if frame then
      local i = first + j - 1
      local src = srcs[j]
      local cur = string.sub(curs, (i - 1) * 8 + 1, i * 8)
      local chi, clo = struct.unpack('>i4i4', cur)
      acks[#acks + 1] = src
      acks[#acks + 1] = struct.pack(ENTRY, chi, clo, deadline, NOW, source_of(frame))
      live[#live + 1] = src
      out[#out + 1] = src
      out[#out + 1] = string.sub(frame, 1, 16) .. cur .. string.sub(frame, 25)
      out[#out + 1] = (struct.unpack('>i4', items[i], 13))
      local attempts = 0
      if #items[i] >= 18 then attempts = (struct.unpack('>I2', items[i], 17)) end
      out[#out + 1] = attempts
      local e = items[i]
      if #e < 18 then e = e .. string.rep('\0', 18 - #e) end
      kept[#kept + 1] = e .. struct.pack('>I4', i)
    else
      vanished = vanished + 1
    end
  end
  if #live > 0 then
    redis.call('HSET', ACKS, unpack(acks))
    redis.call('SADD', tkey, unpack(live))
  end
end
if #out > 0 and not indexed[deadline] then
  redis.call('ZADD', TIDX, deadline, string.format('%d', deadline))
  indexed[deadline] = true
end
count('replays_vanished', vanished)
count('replays_claimed', #out / 4)
flush_counts()
redis.call('SET', token_key, table.concat(kept), 'PX', CLAIM_TOKEN_TTL_MS)
return out
