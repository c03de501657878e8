-- Re-drive dead letters (after a fix): each goes back to its source's replay queue under
-- a new source id, its history kept with a 'redrive' mark (attempts count from there).
-- ARGV: source ids (n x 8 bytes); empty = every dead letter of this shard.
-- Returns the number re-driven.

local ids = ARGV[1]
local wanted = {}
if #ids == 0 then
  wanted = redis.call('HKEYS', DLQ)
else
  for pos = 1, #ids, 8 do wanted[#wanted + 1] = ssub(ids, pos, pos + 7) end
end
local n = 0
for _, src in ipairs(wanted) do
  local raw = redis.call('HGET', DLQ, src)
  if raw then
    local entry = cmsgpack.unpack(raw)
    local frame, hist = entry[1], entry[2]
    hist[#hist + 1] = {'redrive', NOW, 0, ''}
    local _, _, lo = split_id(src)
    requeue(frame, packed_history(hist), attempts_since_redrive(hist), lo)
    redis.call('HDEL', DLQ, src)
    local lin = lineage_of(frame)
    if lin and redis.call('HGET', PREFIX .. ':dlqlin', lin) == src then
      redis.call('HDEL', PREFIX .. ':dlqlin', lin)
    end
    count(pending_name(source_of(frame)))
    count('redriven')
    n = n + 1
  end
end
commit_failures()
flush_counts()
return n
