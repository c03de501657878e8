-- Take up to ARGV[2] replays of source ARGV[1] off this shard's queue for a source task.
-- ARGV: source, count, current ids (count x 8 bytes), interval_ms, buckets, token.
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
local QITEM = 18

-- Init (claim) or only read (a retry: init = false) the records of queue entries.
local function claim(items, deadline, init)
  local got, frames, lens, idx, vanished = {}, {}, {}, {}, 0
  for i = 1, #items do
    local hi, slot, lo = split_id(items[i])
    local b = bucket(hi, lo)
    local frame = nil
    local ehi, _, _, _, off, src_index = get(b, slot)
    if ehi and off ~= NOFRAME then frame = frame_at(b, off) end
    if frame then
      if init then
        local chi, clo = sunpack('>i4i4', curs, (i - 1) * 8 + 1)
        put(b, slot, chi, clo, deadline, NOW, off, src_index)
        add_timeout(b, deadline)
      end
      local k = #got + 1
      got[k], frames[k], lens[k], idx[k] = items[i], frame, #frame, i
    else
      vanished = vanished + 1
    end
  end
  local out = {table.concat(got), table.concat(frames), vanished}
  for k = 1, #lens do out[k + 3] = lens[k] end
  if vanished > 0 then
    local n = #lens
    for k = 1, n do out[n + k + 3] = idx[k] end
  end
  return out, vanished, #got
end

local seen = redis.call('GET', token_key)
if seen then
  local items = {}
  for pos = 1, #seen, QITEM do items[#items + 1] = ssub(seen, pos, pos + QITEM - 1) end
  return (claim(items, 0, false))
end

local deadline = deadline_for(tonumber(ARGV[4]), tonumber(ARGV[5]))
local items = redis.call('LPOP', PREFIX .. ':replay:' .. source, want)
if not items then
  redis.call('SET', token_key, '', 'PX', CLAIM_TOKEN_TTL_MS)
  return {}
end
local out, vanished, claimed = claim(items, deadline, true)
commit()
count('replays_vanished', vanished)
count('replays_claimed', claimed)
flush_counts()
redis.call('SET', token_key, table.concat(items), 'PX', CLAIM_TOKEN_TTL_MS)
return out
