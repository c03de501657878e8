-- core/failures.lua -- failing records: replay (a new id, queued) or dead letter. Owns:
-- the failure histories' reading and packing, the replay queue entries, fail_many and its
-- argument parsers, commit_failures. Invariants (docs/architecture.md 5, 6, 8): a failure
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
-- on_dead_letter callbacks read: ftlayer/deadletters.py).
local function log_dead_letter(src, source)
  redis.call('XADD', PREFIX .. ':dlqlog', 'MAXLEN', '~', DLQ_LOG_MAX, '*',
             'src', src, 'source', source)
end

local FAILED = {explicit = 'failed_explicit', timeout = 'failed_timeout'}

-- Writes of failures, buffered and issued in bulk by commit_failures() (histories are
-- written with their buckets, by commit()). dead_ids: the source ids this call
-- dead-lettered, in order (returned by the scripts that report them: a driver attributes
-- each to the stage it failed in).
local dlq_set, queues, dead_ids

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
-- The one way a record joins its source's replay queue: as slot ``slot`` of bucket b, its
-- stored record at ``off`` of b's frames (placed there already), with its packed history
-- and its failed attempts since the last redrive. It already counts as pending; its entry
-- holds only the frame: no ack value and no timeout until a source task claims it.
local function enqueue(b, slot, off, hc, part, source, packed_hist, attempts)
  put(b, slot, 0, 0, 0, 0, off, source)
  set_history(b, slot, packed_hist)
  local items = queues[source]
  if not items then
    queue_names[source] = PREFIX .. ':replay:' .. source
    items = {}
    queues[source] = items
  end
  if attempts > 65535 then attempts = 65535 end
  items[#items + 1] = spack(QUEUE_ENTRY, b.hi, slot, b.lo, hc, part, attempts)
end

-- Queue the stored record ``frame`` for replay under a new source id, in a fresh bucket of
-- the shard whose low id bits are ``lo`` (invariant 5). It is copied as it is: it holds no
-- ids (the entry's place names the record).
local function requeue(frame, packed_hist, attempts, lo)
  local b, slot = new_source_id(lo, #frame)
  local hc, part, source = queue_fields_of(frame)
  enqueue(b, slot, add_frame(b, frame), hc, part, source, packed_hist, attempts)
end

-- pending: it counted as pending until now (a vectorized batch's residue did not).
local function dead_letter(src, frame, hist, source, pending)
  dlq_set[#dlq_set + 1] = src
  dead_ids[#dead_ids + 1] = src
  dlq_set[#dlq_set + 1] = cmsgpack.pack({frame, hist, NOW})
  log_dead_letter(src, source)
  count('dead_lettered')
  if pending then count(pending_name(source), -1) end
end

local function commit_failures()
  commit()
  bulk('HSET', DLQ, dlq_set)
  for source, items in pairs(queues) do bulk('RPUSH', queue_names[source], items) end
  dlq_set, queues = {}, {}
end

-- FTLayer.fail for many records (invariants 5, 6, 8): retire each source id; either
-- re-persist the record under a new source id in the same shard and queue it for replay
-- with its hash code and original partition, or, past its budget, move it to the
-- dead-letter hash with its history. Never acks.
-- Parallel arrays, one index per record: srcs (8-byte ids, or false: made from the bucket
-- and slot if a dead letter needs it), bs and slots (its bucket and
-- slot), offs (its frame's offset if the caller read its entry already, else false: then
-- the entry is looked up; each such src must appear once); reason, err and budget either
-- arrays or one value for all (budget -1: the record's own, from its frame).
-- Returns {replayed, dead_lettered, orphans}; writes are buffered (commit_failures()).
local function fail_many(srcs, bs, slots, offs, reason, err, budget)
  local done = {0, 0, 0}
  local rs, es, bud = type(reason) == 'table', type(err) == 'table', type(budget) == 'table'
  for i = 1, #srcs do
    local src, b, slot, off = srcs[i], bs[i], slots[i], offs[i]
    local r, e, bu = reason, err, budget
    if rs then r = reason[i] end
    if es then e = err[i] end
    if bud then bu = budget[i] end
    local frame, flen, hc, part, source, own = nil, nil, nil, nil, nil, nil
    if not off then
      local hi, _, _, _, o = get(b, slot)
      if hi then off = o end
    end
    if off then
      remove(b, slot)
      if off ~= NOFRAME then
        -- whole in the stored frames: read in place, copied without a string
        flen, hc, part, source, own = stored_head(b, off)
        if not flen then frame = frame_at(b, off) end
      end
    end
    if not frame and not flen then
      count('orphans')
      done[3] = done[3] + 1
    else
      if rs then count(FAILED[r] or ('failed_' .. r)) end
      local packed = histories_of(b)[schar(slot)]
      local first = false -- the common case: a first failure within the budget
      if not packed then
        if not flen then first = budget_of(frame, bu) >= 1
        elseif bu >= 0 then first = bu >= 1
        else first = own >= 1 end
      end
      if first and flen then  -- requeue, the frame copied in place (no string made)
        local nb, slot = new_source_id(b.lo, flen)
        enqueue(nb, slot, copy_frame(nb, b, off, flen), hc, part, source,
                first_history(r, e), 1)
        done[1] = done[1] + 1
      elseif first then
        requeue(frame, first_history(r, e), 1, b.lo)
        done[1] = done[1] + 1
      else
        if not frame then frame = ssub(b.frames, off + 1, off + flen) end
        local hist = {}
        if packed then
          hist = cmsgpack.unpack(packed)
          del_history(b, slot)
        end
        local attempt = attempts_since_redrive(hist) + 1
        hist[#hist + 1] = {r, NOW, attempt, e}
        if attempt > budget_of(frame, bu) then
          dead_letter(src or id_of(b, slot), frame, hist, source_of(frame), true)
          done[2] = done[2] + 1
        else
          requeue(frame, packed_history(hist), attempt, b.lo)
          done[1] = done[1] + 1
        end
      end
    end
  end
  if done[1] > 0 then count('replayed', done[1]) end
  local failed = #srcs - done[3]
  if not rs and failed > 0 then count(FAILED[reason] or ('failed_' .. reason), failed) end
  return done
end

-- fail_many for a list of {src, reason, err, budget} tables (parse_fails).
local function fail_records(list)
  local srcs, bs, slots, offs, reasons, errs, budgets = {}, {}, {}, {}, {}, {}, {}
  for i, f in ipairs(list) do
    local hi, slot, lo = split_id(f[1])
    srcs[i], bs[i], slots[i], offs[i] = f[1], bucket(hi, lo), slot, false
    reasons[i], errs[i], budgets[i] = f[2], f[3], f[4]
  end
  return fail_many(srcs, bs, slots, offs, reasons, errs, budgets)
end

-- Parse a packed list of failures: repeated [source id 8][reason u8: 1 explicit,
-- 2 timeout, 3 explicit and dead-lettered now][err_len u16][err].
local function parse_fails(fails, max_replays)
  local list = {}
  local pos, n = 1, #fails
  while pos <= n do
    local src, code, elen
    src, code, elen, pos = sunpack(FAIL_HEAD, fails, pos)
    local err = ssub(fails, pos, pos + elen - 1)
    pos = pos + elen
    local budget = max_replays
    if code == DEAD_LETTER_CODE then budget = 0 end
    list[#list + 1] = {src, REASONS[code] or 'explicit', err, budget}
  end
  return list
end
