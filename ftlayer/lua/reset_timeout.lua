-- Storm's resetTimeout: give pending records a fresh deadline (long-running work).
-- ARGV: interval_ms, buckets, source ids (n x 8 bytes). Returns how many were pending.

local deadline = deadline_for(tonumber(ARGV[1]), tonumber(ARGV[2]))
local ids, found = ARGV[3], 0
for pos = 1, #ids, 8 do
  local base, slot = split_id(string.sub(ids, pos, pos + 7))
  local b = bucket(base)
  local v = entry_of(b, slot)
  if v then
    local hi, lo, dl, inited, off, source = struct.unpack(ENTRY, v)
    if dl ~= deadline then
      put(b, slot, hi, lo, deadline, inited, off, source)
      add_timeout(b, deadline)
    end
    found = found + 1
  end
end
commit()
return found
