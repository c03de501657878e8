-- Take up to ARGV[2] replays of source ARGV[1] off this shard's queue for a source task.
-- ARGV: source, count, current ids (count x 8 bytes), interval_ms, buckets.
-- Each claimed record is inited here with the current id it will be emitted with, and
-- gets a fresh timeout: if the claiming task dies, the record times out and is replayed
-- again (nothing lost); while it only waits in the queue it burns no attempt.
-- Returns a flat list: frame, original partition, frame, original partition, ...
-- (frames carry the new source id and the claimed current id).

local source, want, curs = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local deadline = deadline_for(tonumber(ARGV[4]), tonumber(ARGV[5]))
local items = redis.call('LPOP', PREFIX .. ':replay:' .. source, want)
local out = {}
if not items then return out end
for i, item in ipairs(items) do
  local src = string.sub(item, 1, 8)
  local frame = redis.call('HGET', REC, src)
  if frame then
    local cur = string.sub(curs, (i - 1) * 8 + 1, i * 8)
    local chi, clo = struct.unpack('>i4i4', cur)
    redis.call('HSET', ACKS, src, struct.pack(ENTRY, chi, clo, deadline, NOW, source_of(frame)))
    add_timeout(src, deadline)
    out[#out + 1] = string.sub(frame, 1, 16) .. cur .. string.sub(frame, 25)
    out[#out + 1] = (struct.unpack('>i4', item, 13))
  else
    count('replays_vanished')
  end
end
count('replays_claimed', #out / 2)
flush_counts()
return out
