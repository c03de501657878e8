-- Storm's resetTimeout: give pending records a fresh deadline (long-running work).
-- ARGV: interval_ms, buckets, source ids (n x 8 bytes). Returns how many were pending.

local deadline = deadline_for(tonumber(ARGV[1]), tonumber(ARGV[2]))
local ids, found = ARGV[3], 0
for pos = 1, #ids, 8 do
  local hi, slot, lo = split_id(ids, pos)
  local b = bucket(hi, lo)
  local hi, lo, dl, inited, off, source = get(b, slot)
  if hi then
    if dl ~= deadline then
      put(b, slot, hi, lo, deadline, inited, off, source)
      add_timeout(b, deadline)
    end
    found = found + 1
  end
end
commit()
return found
