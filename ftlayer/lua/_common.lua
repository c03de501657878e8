-- Prelude shared by every ftlayer script (ftlayer/scripts.py prepends it).
--
-- One shard per call: every key lives under the hash tag {ns:k}, so a script touches one
-- slot and runs unchanged on Redis Cluster. KEYS: acks, rec, hist, stats, tmoidx, dlq;
-- the per-deadline timeout sets and replay queues are derived from the same prefix.
--
-- Ids travel and are stored as 8 raw big-endian bytes. Lua numbers are doubles, so 64-bit
-- values are handled as two signed 32-bit halves with LuaBitOp (bit.bxor).
--
-- Ack entry (acks hash, field = source id), struct '>i4i4ddH':
--   ack value hi, lo | deadline_ms of its timeout set | inited_ms (0: init not applied
--   yet) | source index (65535: unknown, an entry created by an XOR before its init)
-- Invariant 2: an entry completes only when its value is 0 AND inited_ms > 0.

local ACKS, REC, HIST, STATS, TIDX, DLQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local PREFIX = string.sub(ACKS, 1, -6) -- strip ':acks'
local ENTRY = '>i4i4ddH'
-- MAX_REPLAYS, UNKNOWN_SOURCE, FLUSH_TOKEN_TTL_MS, ... come from ftlayer/limits.py
local LATENCY_BOUNDS_MS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                           60000, 300000}

local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local NOW_US = clock[1] .. clock[2]

local counts = {}
local function count(name, n)
  counts[name] = (counts[name] or 0) + (n or 1)
end

local function flush_counts()
  for name, n in pairs(counts) do
    if n ~= 0 then redis.call('HINCRBY', STATS, name, n) end
  end
end

local LATENCY_NAMES = {}
for i, bound in ipairs(LATENCY_BOUNDS_MS) do LATENCY_NAMES[i] = 'latency_le_' .. bound end

local function observe_latency(ms)
  count('latency_count')
  count('latency_sum_ms', ms)
  for i = 1, #LATENCY_BOUNDS_MS do
    if ms <= LATENCY_BOUNDS_MS[i] then
      count(LATENCY_NAMES[i])
      return
    end
  end
end

local function tmo_key(deadline)
  return PREFIX .. ':tmo:' .. string.format('%d', deadline)
end

-- Deadline of a record persisted now: the end of the bucket B intervals ahead, so it
-- fails between (B-1)*I = T and B*I = T*B/(B-1) after it was persisted.
local function deadline_for(interval_ms, buckets)
  return (math.floor(NOW / interval_ms) + buckets) * interval_ms
end

local indexed = {}
local function add_timeout(src, deadline)
  redis.call('SADD', tmo_key(deadline), src)
  if not indexed[deadline] then
    redis.call('ZADD', TIDX, deadline, string.format('%d', deadline))
    indexed[deadline] = true
  end
end

local function remove_timeout(src, deadline)
  if deadline > 0 then redis.call('SREM', tmo_key(deadline), src) end
end

local function source_of(frame)
  return (struct.unpack('>I2', frame, 33))
end

-- The record's replay budget, written into its frame by the pipeline that persisted it;
-- an override >= 0 (a sidecar's --max-replays) replaces it.
local function budget_of(frame, override)
  if override >= 0 then return override end
  return (struct.unpack('>I2', frame, 35))
end

-- A new random source id in the same shard: the low 16 bits (which pick the shard, see
-- ftlayer/ids.py) are kept, the other 47 come from SHA-1 of the old id, the attempt and
-- the server clock (math.random is seeded identically on every call, so it is unusable).
-- Bit 63 stays clear: it marks batch-local ids of the vectorized path (ftlayer/ids.py).
local function new_source_id(src, salt)
  local h = redis.sha1hex(src .. ':' .. salt .. ':' .. NOW_US)
  local hi = tonumber(string.sub(h, 1, 8), 16) % 2147483648
  local _, lo_old = struct.unpack('>I4I4', src)
  local lo = tonumber(string.sub(h, 9, 12), 16) * 65536 + (lo_old % 65536)
  if hi == 0 and lo == 0 then hi = 1 end
  return struct.pack('>I4I4', hi, lo)
end

-- Failed attempts since the record was last re-driven out of the dead-letter hash: the
-- attempt number of its newest history entry (an entry may stand for several attempts:
-- replays at the source record only the last one; a 'redrive' mark holds 0).
local function attempts_since_redrive(hist)
  if #hist == 0 then return 0 end
  return hist[#hist][3]
end

-- A replay queue entry: new id | hash code | original partition | failed attempts u16
-- (18 bytes; claim hands the attempts to the stage contexts).
local function queue_entry(new, frame, attempts)
  return new .. string.sub(frame, 25, 32) .. struct.pack('>I2', math.min(attempts, 65535))
end

-- Note a dead letter in this shard's dead-letter log (a capped stream that the drivers'
-- on_dead_letter callbacks read: ftlayer/deadletters.py).
local function log_dead_letter(src, source)
  redis.call('XADD', PREFIX .. ':dlqlog', 'MAXLEN', '~', DLQ_LOG_MAX, '*',
             'src', src, 'source', source)
end

-- Store a frame under a new source id and queue it for replay (the record already
-- counts as pending).
local function requeue(src, frame, hist, salt)
  local new = new_source_id(src, salt)
  redis.call('HSET', REC, new, string.sub(frame, 1, 8) .. new .. string.sub(frame, 17))
  redis.call('HSET', HIST, new, cmsgpack.pack(hist))
  redis.call('RPUSH', PREFIX .. ':replay:' .. source_of(frame),
             queue_entry(new, frame, attempts_since_redrive(hist)))
  return new
end

-- FTLayer.fail (invariants 5, 6, 8): retire src; either re-persist the record under a new
-- source id in the same shard and queue it for replay with its hash code and original
-- partition, or, past max_replays, move it to the dead-letter hash with its history.
-- Never acks. Returns 1 replayed, 2 dead-lettered, 0 orphan (nothing pending under src).
-- max_replays: -1 each record's own budget; 0 dead-letters at once.
local function fail_record(src, reason, err, max_replays)
  local frame = redis.call('HGET', REC, src)
  local entry = redis.call('HGET', ACKS, src)
  if entry then
    local _, _, deadline = struct.unpack(ENTRY, entry)
    remove_timeout(src, deadline)
    redis.call('HDEL', ACKS, src)
  end
  if not frame then
    count('orphans')
    return 0
  end
  local packed_hist = redis.call('HGET', HIST, src)
  local hist = {}
  if packed_hist then hist = cmsgpack.unpack(packed_hist) end
  local attempt = attempts_since_redrive(hist) + 1
  hist[#hist + 1] = {reason, NOW, attempt, err}
  local source = source_of(frame)
  count('failed_' .. reason)
  if attempt > budget_of(frame, max_replays) then
    redis.call('HSET', DLQ, src, cmsgpack.pack({frame, hist, NOW}))
    redis.call('HDEL', REC, src)
    redis.call('HDEL', HIST, src)
    log_dead_letter(src, source)
    count('dead_lettered')
    count('pending:' .. source, -1)
    return 2
  end
  requeue(src, frame, hist, #hist)
  redis.call('HDEL', REC, src)
  redis.call('HDEL', HIST, src)
  count('replayed')
  return 1
end

-- Fail a packed list of records: repeated [source id 8][reason u8: 1 explicit,
-- 2 timeout, 3 explicit and dead-lettered now][err_len u16][err].
-- Returns {replayed, dead_lettered, orphans}.
local REASONS = {'explicit', 'timeout', 'explicit'}
local function fail_packed(fails, max_replays)
  local done = {0, 0, 0}
  local pos, n = 1, #fails
  while pos <= n do
    local src, code, elen
    src, code, elen, pos = struct.unpack('>c8BI2', fails, pos)
    local err = string.sub(fails, pos, pos + elen - 1)
    pos = pos + elen
    local budget = max_replays
    if code == 3 then budget = 0 end
    local r = fail_record(src, REASONS[code] or 'explicit', err, budget)
    if r == 0 then r = 3 end
    done[r] = done[r] + 1
  end
  return done
end

-- Store a task summary and index its token under its batch (source:batch:), so that the
-- batch's settlement deletes the summaries of every attempt, the losing ones included.
local function put_summary(token, summary, ttl_ms, batch)
  redis.call('SET', PREFIX .. ':sum:' .. token, summary, 'PX', ttl_ms)
  local idx = PREFIX .. ':sumidx:' .. batch
  redis.call('SADD', idx, token)
  redis.call('PEXPIRE', idx, ttl_ms)
end

-- True when this run (its salt) settled the batch already: a late attempt stores nothing.
local function batch_settled(batch, salt)
  return redis.call('GET', PREFIX .. ':segdone:' .. batch) == salt
end
