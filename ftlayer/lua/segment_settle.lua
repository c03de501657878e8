-- Settle the segments of one shard at the end of a batch (or at their timeout): every row
-- of a segment is complete, except the residues given here, which become per-record
-- entries before the segment is deleted (invariant 6: the new is written first, in the
-- same call). A segment no longer indexed was settled already: the segment itself is the
-- idempotency token of this work, so a retried call is a no-op for it.
-- ARGV: interval_ms, buckets, max_replays, reason ('explicit'|'timeout'), run salt,
--       segments: repeated [member_len u16][member][rows u32][failed u32][pending u32]
--                          [immediate u32: failed attempts its task replayed at once]
--                          [errors u32: distinct error texts of its failed rows],
--         then each error text once [err_len u16][err],
--         then each failed row  [len u32][source id 8][stored][attempts u16][error u32:
--              its text's index, from 0] -> replay queue (or dead letters past the budget),
--         then each pending row [len u32][source id 8][stored][value 8]
--         (len counts the id and the stored record, serialization/stored.py)
--              -> pending with a live timeout, value as its ack value,
--       summary keys to delete (key suffixes joined by ','),
--       batch prefix (source:batch:, or ''): when given, the batch is marked settled by
--       this run (late attempts store no segment and no summary), and the segments and
--       summaries of its other attempts (retried or speculative copies whose output did
--       not count) are dropped,
--       hold_until: ms, a failed row with attempts 0 (held: not attempted, its stage's
--       breaker was open) waits in the delayed queue until then, spending no attempt,
--       elapsed_ms: the batch's time from its start to this settlement on the driver
--       (0: not a batch's end): each row a segment completes is observed as a completion
--       of that latency (the batch scope's persist-to-completion, bounded from above).
-- Returns {segments settled, completed, replayed, dead_lettered, pending, skipped, the
-- dead-lettered source ids (8 bytes each, end to end), the skipped segments' members
-- joined by ','}: a driver attributes each failed row's outcome to the stage it failed in.

local interval_ms, buckets = tonumber(ARGV[1]), tonumber(ARGV[2])
local budget, reason, salt = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local deadline = deadline_for(interval_ms, buckets)
local elapsed_ms = tonumber(ARGV[9]) or 0
local hold_until = tonumber(ARGV[10]) or 0
local idx = PREFIX .. ':segidx'

local done = {0, 0, 0, 0, 0, 0}
local skipped = {}
local segs, pos = ARGV[6], 1
while pos <= #segs do
  local member, rows, nf, np, immediate, ne
  member, rows, nf, np, immediate, ne, pos = sunpack(SEGMENT, segs, pos)
  local errors, failed, pending = {}, {}, {}
  for i = 1, ne do
    errors[i], pos = sunpack(SEGMENT_ERROR, segs, pos)
  end
  for i = 1, nf do
    local frame, attempts, e
    frame, attempts, e, pos = sunpack(SEGMENT_FAILED, segs, pos)
    failed[i] = {frame, errors[e + 1], attempts}
  end
  for i = 1, np do
    local frame, value
    frame, value, pos = sunpack(SEGMENT_PENDING, segs, pos)
    pending[i] = {frame, value}
  end
  if redis.call('ZSCORE', idx, member) then
    local held = 0
    for _, f in ipairs(failed) do
      local unit, err, attempts = f[1], f[2], f[3]
      local src, frame = ssub(unit, 1, 8), ssub(unit, 9)
      local source = source_of(frame)
      local dead_now = attempts >= DEAD_NOW
      if dead_now then attempts = attempts - DEAD_NOW end
      local hist = {{reason, NOW, attempts, err}}
      if attempts == 0 and not dead_now then -- held: back to the queue, no attempt spent
        local hi, slot, lo = split_id(src)
        local b = bucket(hi, lo)
        local hc, part = queue_fields_of(frame)
        hist[1][1] = 'held'
        enqueue(b, slot, add_frame(b, frame), hc, part, source, packed_history(hist), 0,
                hold_until)
        held = held + 1
        done[3] = done[3] + 1
        count(pending_name(source))
        count('held')
      elseif dead_now or attempts > budget then
        dead_letter(src, frame, hist, source, false)
        done[4] = done[4] + 1
      else
        local hi, slot, lo = split_id(src)
        local b = bucket(hi, lo)
        local hc, part = queue_fields_of(frame)
        enqueue(b, slot, add_frame(b, frame), hc, part, source, packed_history(hist), attempts)
        done[3] = done[3] + 1
        count(pending_name(source))
        count('replayed')
      end
    end
    for _, p in ipairs(pending) do
      local unit, value = p[1], p[2]
      local hi, slot, lo = split_id(unit)
      local frame = ssub(unit, 9)
      local b = bucket(hi, lo)
      local source = source_of(frame)
      local hi, lo = sunpack(ACK_VALUE, value)
      put(b, slot, hi, lo, deadline, NOW, add_frame(b, frame), source)
      add_timeout(b, deadline)
      done[5] = done[5] + 1
      count(pending_name(source))
    end
    local completed = rows - #failed - #pending
    if elapsed_ms > 0 and completed > 0 then observe_latency(elapsed_ms, completed) end
    count('persisted', rows)
    count('completed_local', completed)
    count('failed_' .. reason, #failed - held + immediate)
    count('replayed', immediate)
    done[1] = done[1] + 1
    done[2] = done[2] + completed
    redis.call('DEL', PREFIX .. ':seg:' .. member)
    redis.call('ZREM', idx, member)
  else
    done[6] = done[6] + 1
    skipped[#skipped + 1] = member
  end
end
local batch = ARGV[8]
if batch ~= '' then
  redis.call('SET', PREFIX .. ':segdone:' .. batch, salt, 'PX', SEGMENT_DONE_TTL_MS)
  local sidx = PREFIX .. ':sumidx:' .. batch
  for _, token in ipairs(redis.call('SMEMBERS', sidx)) do
    redis.call('DEL', PREFIX .. ':sum:' .. token)
  end
  redis.call('DEL', sidx)
  for _, member in ipairs(redis.call('ZRANGE', idx, 0, -1)) do
    if ssub(member, 1, #batch) == batch then
      redis.call('DEL', PREFIX .. ':seg:' .. member)
      redis.call('ZREM', idx, member)
    end
  end
end
commit_failures()
for suffix in string.gmatch(ARGV[7], '[^,]+') do
  redis.call('DEL', PREFIX .. ':sum:' .. suffix)
end
flush_counts()
done[7], done[8] = table.concat(dead_ids), table.concat(skipped, ',')
return done
