-- core/failures.lua -- failing records: replay (a new id, queued) or dead letter. Owns:
-- the failure histories' reading and packing, the replay queue entries, fail_one (in steps)
-- and its argument parser, commit_failures. Invariants (docs/architecture.md 5, 6, 8): a failure
-- retires the old id and writes the new entry (or the dead letter) in the same call;
-- nothing here ever acks; a record past its budget goes to the dead letters with its
-- history, never dropped.
-- Failed attempts since the record was last re-driven out of the dead-letter hash: the
-- attempt number of its newest history entry (an entry may stand for several attempts:
-- replays at the source record only the last one; a 'redrive' mark holds 0).
local function attempts_since_redrive(hist)
  if #hist == 0 then return 0 end
  return hist[#hist][3]
end

-- A replay queue entry, 18 bytes: new id (as split_id reads it: bucket hi, slot, bucket
-- lo) | hash code | original partition | failed attempts (claim hands them to the stage
-- contexts). Made by one spack: no string of the id or of the fields on the way.
-- (QUEUE_ENTRY, from ftlayer/wire.py)

-- Note a dead letter in this shard's dead-letter log (a capped stream that the drivers'
-- on_dead_letter callbacks read, ftlayer/deadletters.py, and that ftlayer/dlq_merge.py
-- follows to join the dead letters of one record held in two shards).
local function log_dead_letter(src, source, lin)
  redis.call('XADD', PREFIX .. ':dlqlog', 'MAXLEN', '~', DLQ_LOG_MAX, '*',
             'src', src, 'source', source, 'lin', lin)
end

-- One dead letter per record (invariant 13). The shard's dead-letter index (``:dlqlin``,
-- lineage id -> the source id its dead letter is held under) finds the entry of a record
-- dead-lettered again -- a batch re-run after a driver crash gives its records new ids --
-- and the new failure joins that entry instead of adding one. Lineage -1 is not indexed:
-- it marks records whose key was null, distinct records sharing it.
local NULL_LINEAGE = '\255\255\255\255\255\255\255\255'

-- The lineage id of a stored record (bytes 21..28, serialization/stored.py), or nil when
-- the record has none to index (too short to hold one, or -1).
local function lineage_of(frame)
  local lin = ssub(frame, 21, 28)
  if #lin ~= 8 or lin == NULL_LINEAGE then return nil end
  return lin
end

local function hex_id(src)
  return (string.gsub(src, '.', function(c) return string.format('%02x', string.byte(c)) end))
end

-- The dead-letter entry ``raw`` (packed {frame, history, time}) joined by the same record
-- dead-lettered again under ``src`` with ``frame`` and ``hist``: the newer frame, the
-- older history, an 'again' mark naming src (attempts count afresh after it, as after a
-- 'redrive'), then the newer history. nil when raw holds that mark already (joined once).
local function joined(raw, src, frame, hist)
  local old = cmsgpack.unpack(raw)
  local h, name = old[2], hex_id(src)
  for _, e in ipairs(h) do
    if e[1] == 'again' and e[4] == name then return nil end
  end
  h[#h + 1] = {'again', NOW, 0, name}
  for _, e in ipairs(hist) do h[#h + 1] = e end
  return cmsgpack.pack({frame, h, NOW})
end

local FAILED = {explicit = 'failed_explicit', timeout = 'failed_timeout'}

-- Writes of failures, buffered and issued in bulk by commit_failures() (histories are
-- written with their buckets, by commit()). dead_ids: the source ids this call
-- dead-lettered, in order (returned by the scripts that report them: a driver attributes
-- each to the stage it failed in).
local dlq_set, queues, dead_ids
local dlq_index -- lineage -> source id, indexed by this call (written by commit_failures)

local first_failures -- reason -> err -> packed one-entry history (memo: a bulk expiry
                     -- fails thousands of records with the same first entry)
local function first_history(reason, err)
  local by_err = table_at(first_failures, reason)
  local packed = by_err[err]
  if not packed then
    packed = cmsgpack.pack({{reason, NOW, 1, err}})
    by_err[err] = packed
  end
  return packed
end

local function packed_history(hist)
  if #hist == 1 and hist[1][3] == 1 then return first_history(hist[1][1], hist[1][4]) end
  return cmsgpack.pack(hist)
end

local queue_names -- source -> its replay queue's key
local later -- source -> {due ms, queue entry, ...}: entries not to be claimed before due
-- The one way a record joins its source's replay queue: as slot ``slot`` of bucket b, its
-- stored record at ``off`` of b's frames (placed there already), with its packed history
-- and its failed attempts since the last redrive. It already counts as pending; its entry
-- holds only the frame: no ack value and no timeout until a source task claims it.
-- ``due`` (ms; nil or past: now): not claimed before then -- it waits in the source's
-- delayed queue (``replay:<source>:later``, a sorted set by due time) meanwhile.
local function enqueue(b, slot, off, hc, part, source, packed_hist, attempts, due)
  put(b, slot, 0, 0, 0, 0, off, source)
  set_history(b, slot, packed_hist)
  if attempts > 65535 then attempts = 65535 end
  local item = spack(QUEUE_ENTRY, b.hi, slot, b.lo, hc, part, attempts)
  if due and due > NOW then
    local wait = table_at(later, source)
    wait[#wait + 1] = due
    wait[#wait + 1] = item
    return
  end
  local items = queues[source]
  if not items then
    queue_names[source] = PREFIX .. ':replay:' .. source
    items = {}
    queues[source] = items
  end
  items[#items + 1] = item
end

-- Queue the stored record ``frame`` for replay under a new source id, in a fresh bucket of
-- the shard whose low id bits are ``lo`` (invariant 5). It is copied as it is: it holds no
-- ids (the entry's place names the record).
local function requeue(frame, packed_hist, attempts, lo, due)
  local b, slot = new_source_id(lo, #frame)
  local hc, part, source = queue_fields_of(frame)
  enqueue(b, slot, add_frame(b, frame), hc, part, source, packed_hist, attempts, due)
end

-- The source id the dead letter of lineage ``lin`` is held under in this shard, or nil.
local function held_under(lin)
  local src = dlq_index[lin]
  if src then return src end
  src = redis.call('HGET', PREFIX .. ':dlqlin', lin)
  if src and redis.call('HEXISTS', DLQ, src) == 1 then return src end
  return nil
end

-- pending: it counted as pending until now (a vectorized batch's residue did not).
-- A record whose lineage has a dead letter here already joins it (counted
-- 'dead_lettered_again', not logged again: on_dead_letter hears of a record once).
local function dead_letter(src, frame, hist, source, pending)
  dead_ids[#dead_ids + 1] = src
  if pending then count(pending_name(source), -1) end
  local lin = lineage_of(frame)
  local held = lin and held_under(lin)
  if held and held ~= src then
    if #dlq_set > 0 then -- the held entry may be one of this call's
      bulk('HSET', DLQ, dlq_set)
      dlq_set = {}
    end
    local entry = joined(redis.call('HGET', DLQ, held), src, frame, hist)
    if entry then redis.call('HSET', DLQ, held, entry) end
    count('dead_lettered_again')
    return
  end
  dlq_set[#dlq_set + 1] = src
  dlq_set[#dlq_set + 1] = cmsgpack.pack({frame, hist, NOW})
  if lin then dlq_index[lin] = src end
  log_dead_letter(src, source, lin or '')
  count('dead_lettered')
end

local function commit_failures()
  commit()
  bulk('HSET', DLQ, dlq_set)
  local index = {}
  for lin, src in pairs(dlq_index) do
    index[#index + 1] = lin
    index[#index + 1] = src
  end
  bulk('HSET', PREFIX .. ':dlqlin', index)
  dlq_index = {}
  for source, items in pairs(queues) do bulk('RPUSH', queue_names[source], items) end
  for source, wait in pairs(later) do
    bulk('ZADD', PREFIX .. ':replay:' .. source .. ':later', wait)
  end
  dlq_set, queues, later = {}, {}, {}
end

-- What fail_one did with a record: an index into a fail call's outcome tallies
-- {replayed, dead_lettered, orphans}.
local REPLAYED, DEAD, ORPHAN = 1, 2, 3

-- fail_one in steps. A first failure within the budget (the common case): requeued with
-- a one-entry history; the stored record copied in place when it lies whole in the frames
-- read (flen set, with its hash code, partition and source: no string made), else from
-- ``frame``.
local function replay_first(b, off, flen, hc, part, source, frame, reason, err)
  if flen then
    local nb, nslot = new_source_id(b.lo, flen)
    enqueue(nb, nslot, copy_frame(nb, b, off, flen), hc, part, source,
            first_history(reason, err), 1)
  else
    requeue(frame, first_history(reason, err), 1, b.lo)
  end
end

-- A later failure: its history (``packed``, nil: none) grows by one entry, the old one
-- deleted; requeued within the budget, dead-lettered past it. Returns REPLAYED or DEAD.
local function fail_again(src, b, slot, frame, packed, reason, err, budget)
  local hist = {}
  if packed then
    hist = cmsgpack.unpack(packed)
    del_history(b, slot)
  end
  local attempt = attempts_since_redrive(hist) + 1
  hist[#hist + 1] = {reason, NOW, attempt, err}
  if attempt > budget_of(frame, budget) then
    dead_letter(src or id_of(b, slot), frame, hist, source_of(frame), true)
    return DEAD
  end
  requeue(frame, packed_history(hist), attempt, b.lo)
  return REPLAYED
end

-- FTLayer.fail for one record (invariants 5, 6, 8): retire its source id (entry ``slot``
-- of bucket b); either re-persist the record under a new source id in the same shard and
-- queue it for replay with its hash code and original partition, or, past its budget,
-- move it to the dead-letter hash with its history. Never acks. An entry without a stored
-- record (or none at all) is an orphan: counted, nothing else.
-- src: its 8-byte id, or false (made from b and slot if a dead letter needs it). off: its
-- frame's offset if the caller read the entry already, else false (looked up now).
-- budget: replays allowed, -1 for the record's own (from its stored record).
-- new_payload: nil, or {checksum, payload}: the record is requeued (or dead-lettered) with
-- this payload in place of its stored one (core/records.lua with_payload).
-- Returns REPLAYED, DEAD or ORPHAN; writes are buffered (commit_failures()).
local function fail_one(src, b, slot, off, reason, err, budget, new_payload)
  if not off then
    local hi, _, _, _, o = get(b, slot)
    if not hi then
      count('orphans')
      return ORPHAN
    end
    off = o
  end
  remove(b, slot)
  local flen, hc, part, source, own, frame
  if off ~= NOFRAME then
    flen, hc, part, source, own = stored_head(b, off) -- read in place, one unpack
    if not flen then frame = frame_at(b, off) end
  end
  if not flen and not frame then
    count('orphans')
    return ORPHAN
  end
  if new_payload then -- stored from now on with the payload given (NEW_PAYLOAD)
    frame = with_payload(frame or ssub(b.frames, off + 1, off + flen), new_payload[2],
                         new_payload[1])
    flen = nil
  end
  count(FAILED[reason] or ('failed_' .. reason))
  local packed = histories_of(b)[schar(slot)]
  local outcome = REPLAYED
  local allowed = budget
  if allowed < 0 then allowed = own or budget_of(frame, budget) end
  if not packed and allowed >= 1 then
    replay_first(b, off, flen, hc, part, source, frame, reason, err)
  else
    if not frame then frame = ssub(b.frames, off + 1, off + flen) end
    outcome = fail_again(src, b, slot, frame, packed, reason, err, budget)
  end
  if outcome == REPLAYED then count('replayed') end
  return outcome
end

-- A record that was not attempted (a stage's breaker held it: what it calls is down) goes
-- back to the queue under a new source id, not to be claimed before ``due``, its history
-- noting the hold with its attempt number unchanged: no attempt of its budget is spent.
-- Returns REPLAYED or ORPHAN.
local function hold_one(b, slot, err, due)
  local hi, _, _, _, off = get(b, slot)
  if not hi or off == NOFRAME then
    count('orphans')
    return ORPHAN
  end
  remove(b, slot)
  local frame = frame_at(b, off)
  local packed = histories_of(b)[schar(slot)]
  local hist = {}
  if packed then
    hist = cmsgpack.unpack(packed)
    del_history(b, slot)
  end
  local attempt = attempts_since_redrive(hist)
  hist[#hist + 1] = {'held', NOW, attempt, err}
  requeue(frame, packed_history(hist), attempt, b.lo, due)
  count('held')
  return REPLAYED
end

-- fail_one (hold_one for reason 'held') for a list of {src, reason, err, budget} tables
-- (parse_fails); ``hold_until``: the due time (ms) of the held ones. Returns the outcome
-- tallies {replayed, dead_lettered, orphans}.
local function fail_records(list, hold_until)
  local done = {0, 0, 0}
  for _, f in ipairs(list) do
    local hi, slot, lo = split_id(f[1])
    local outcome
    if f[2] == 'held' then
      outcome = hold_one(bucket(hi, lo), slot, f[3], hold_until)
    else
      outcome = fail_one(f[1], bucket(hi, lo), slot, false, f[2], f[3], f[4], f[5])
    end
    done[outcome] = done[outcome] + 1
  end
  return done
end

-- Parse a packed list of failures: repeated [source id 8][reason u8: 1 explicit,
-- 2 timeout, 3 explicit and dead-lettered now, 4 held; + NEW_PAYLOAD: a new payload
-- follows the error][err_len u16][err], then with NEW_PAYLOAD [payload_len u32]
-- [checksum u32][payload].
local function parse_fails(fails, max_replays)
  local list = {}
  local pos, n = 1, #fails
  while pos <= n do
    local src, code, elen, new_payload
    src, code, elen, pos = sunpack(FAIL_HEAD, fails, pos)
    local err = ssub(fails, pos, pos + elen - 1)
    pos = pos + elen
    if code >= NEW_PAYLOAD then
      local plen, sum
      code = code - NEW_PAYLOAD
      plen, sum, pos = sunpack(FAIL_PAYLOAD, fails, pos)
      new_payload = {sum, ssub(fails, pos, pos + plen - 1)}
      pos = pos + plen
    end
    local budget = max_replays
    if code == DEAD_LETTER_CODE then budget = 0 end
    list[#list + 1] = {src, REASONS[code] or 'explicit', err, budget, new_payload}
  end
  return list
end
