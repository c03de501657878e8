-- Take up to ARGV[2] replays of source ARGV[1] off this shard's queue for a source task:
-- those of its delayed queue (``replay:<source>:later``) that are due first, then the
-- queue's head.
-- ARGV: source, count, current ids (count x 8 bytes), interval_ms, buckets, token, and
-- optionally the token's time to live in ms (default CLAIM_TOKEN_TTL_MS) and a mode:
--   ""       a claim: a token seen before replies its records again, an unseen one pops;
--   "stream" the same, but a claim that popped nothing keeps no token, so a later call with
--            the same token pops what was queued since (the replay stream's offsets), and
--            the reply leaves the stored records out (its tasks read them by "read");
--   "read"   only replies a seen token's records again; never pops (the replay stream's
--            tasks read what the stream's offset claimed).
-- The token names this claim: the queue entries it took are kept under it for
-- CLAIM_TOKEN_TTL_MS (18 bytes a record, not the frames), and a call with a token already
-- seen (a retry after a lost reply) returns the same records again instead of popping
-- more (which would strand the first ones until they time out).
-- Each claimed record is inited here with the current id it will be emitted with (the
-- i-th popped entry gets the i-th id of ARGV[3]), and gets a fresh timeout: if the
-- claiming task dies, the record times out and is replayed again (nothing lost); while it
-- only waits in the queue it burns no attempt.
-- Returns {queue entries, stored records, vanished, n lengths, [n indices]} for the n
-- records claimed: their queue entries end to end (source id 8 | hash code 4 | original
-- partition 4 | failed attempts 2), their stored records end to end
-- (serialization/stored.py) and each one's length; when some popped entries' records had
-- vanished (left out, counted), also each claimed record's index among the popped entries
-- (1-based: its current id is that one of ARGV[3]; without them, the k-th claimed is the
-- k-th popped). The caller decodes every record on its own, so one that no longer decodes
-- can still be dead-lettered alone.
-- Redis is called per bucket (one GET of its entries, one of its frames, one SET), not
-- per record, and the reply holds two strings and integers, not strings per record.

local token_key = PREFIX .. ':claim:' .. ARGV[6]
local source, want, curs = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local ttl = tonumber(ARGV[7] or '') or CLAIM_TOKEN_TTL_MS
local mode = ARGV[8] or ''
local QITEM = 18

-- Init (claim) or only read (a retry: init = false) the records of queue entries (``all``:
-- the entries end to end). Stored records lying end to end in one bucket's frames (those
-- requeued together: the usual case) are copied to the reply as one string per run, not
-- one per record.
local function claim(items, all, deadline, init)
  local got, frames, lens, idx, vanished = {}, {}, {}, {}, 0
  local run_b, run_s, run_e, timed = nil, 0, 0, nil
  local function end_run()
    if run_b and mode ~= 'stream' then frames[#frames + 1] = ssub(run_b.frames, run_s + 1, run_e) end
    run_b = nil
  end
  for i = 1, #items do
    local hi, slot, lo = split_id(items[i])
    local b = bucket(hi, lo)
    local len = nil
    local ehi, _, _, _, off, src_index = get(b, slot)
    if ehi and off ~= NOFRAME then
      len = stored_len(b, off)
      if len then
        if run_b ~= b or run_e ~= off then
          end_run()
          run_b, run_s = b, off
        end
        run_e = off + len
      else -- cut short: handed out as it is (the caller names what is wrong with it)
        local frame = frame_at(b, off)
        if frame then
          end_run()
          frames[#frames + 1] = frame
          len = #frame
        end
      end
    end
    if len then
      if init then
        local chi, clo = sunpack(ACK_VALUE, curs, (i - 1) * 8 + 1)
        put(b, slot, chi, clo, deadline, NOW, off, src_index)
        if b ~= timed then
          add_timeout(b, deadline)
          timed = b
        end
      end
      local k = #lens + 1
      got[k], lens[k], idx[k] = items[i], len, i
    else
      vanished = vanished + 1
    end
  end
  end_run()
  if vanished > 0 then all = table.concat(got) end
  local out = {all, table.concat(frames), vanished}
  for k = 1, #lens do out[k + 3] = lens[k] end
  if vanished > 0 then
    local n = #lens
    for k = 1, n do out[n + k + 3] = idx[k] end
  end
  return out, vanished, #got
end

local seen = redis.call('GET', token_key)
if seen and (seen ~= '' or mode ~= 'stream') then
  local items = {}
  for pos = 1, #seen, QITEM do items[#items + 1] = ssub(seen, pos, pos + QITEM - 1) end
  return (claim(items, seen, 0, false))
end

if mode == 'read' then return {} end

local deadline = deadline_for(tonumber(ARGV[4]), tonumber(ARGV[5]))
-- entries of the delayed queue that are due come first, then the queue's head
local items = false
if want > 0 then
  local later_key = PREFIX .. ':replay:' .. source .. ':later'
  local due = redis.call('ZRANGEBYSCORE', later_key, '-inf', NOW, 'LIMIT', 0, want)
  if #due > 0 then bulk('ZREM', later_key, due) end
  local head = #due < want and redis.call('LPOP', PREFIX .. ':replay:' .. source, want - #due)
  if head then
    for _, item in ipairs(head) do due[#due + 1] = item end
  end
  if #due > 0 then items = due end
end
if not items then
  if mode ~= 'stream' then redis.call('SET', token_key, '', 'PX', ttl) end
  return {}
end
local all = table.concat(items)
local out, vanished, claimed = claim(items, all, deadline, true)
commit()
count('replays_vanished', vanished)
count('replays_claimed', claimed)
flush_counts()
redis.call('SET', token_key, all, 'PX', ttl)
return out
