-- core/stats.lua -- the namespace's counters (the :stats hash) and the completion-latency
-- histogram. Owns: count, observe_latency, pending_name, flush_counts. Invariant: a call's
-- changes reach the hash once, at flush_counts (one HINCRBY per counter changed), so a
-- call that raises before it changes no counter.
local counts -- stats counter -> change
local function count(name, n)
  counts[name] = (counts[name] or 0) + (n or 1)
end

-- completions' latencies, folded into the counts by flush_counts (no counter name looked
-- up per completion): how many, their sum, and how many fell in each LATENCY_BOUNDS_MS
local lat_n, lat_sum, lat_hits

local function flush_counts()
  if lat_n > 0 then
    count('latency_count', lat_n)
    count('latency_sum_ms', lat_sum)
    for i, n in pairs(lat_hits) do count(LATENCY_NAMES[i], n) end
    lat_n, lat_sum, lat_hits = 0, 0, {}
  end
  for name, n in pairs(counts) do
    if n ~= 0 then redis.call('HINCRBY', STATS, name, n) end
  end
  counts = {}
end

-- n completions (1 by default) that each took ms
local function observe_latency(ms, n)
  n = n or 1
  lat_n = lat_n + n
  lat_sum = lat_sum + ms * n
  for i = 1, #LATENCY_BOUNDS_MS do
    if ms <= LATENCY_BOUNDS_MS[i] then
      lat_hits[i] = (lat_hits[i] or 0) + n
      return
    end
  end
end

local pending_names
local function pending_name(source)
  local name = pending_names[source]
  if not name then
    name = 'pending:' .. source
    pending_names[source] = name
  end
  return name
end
