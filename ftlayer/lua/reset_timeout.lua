-- Storm's resetTimeout: give pending records a fresh deadline (long-running work).
-- ARGV: interval_ms, buckets, source ids (n x 8 bytes). Returns how many were pending.

local deadline = deadline_for(tonumber(ARGV[1]), tonumber(ARGV[2]))
local ids, found = ARGV[3], 0
for pos = 1, #ids, 8 do
  local src = string.sub(ids, pos, pos + 7)
  local entry = redis.call('HGET', ACKS, src)
  if entry then
    local hi, lo, dl, inited, source = struct.unpack(ENTRY, entry)
    if dl ~= deadline then
      remove_timeout(src, dl)
      add_timeout(src, deadline)
      redis.call('HSET', ACKS, src, struct.pack(ENTRY, hi, lo, deadline, inited, source))
    end
    found = found + 1
  end
end
return found
