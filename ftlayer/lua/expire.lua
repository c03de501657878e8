-- Expire due timeout entries of one shard, at most ARGV[1] of them per call (chunks keep
-- Redis responsive with a million pending records). ARGV: limit, max_replays (-1: each
-- record's own budget, from its frame; >= 0: an override).
-- Idempotent and safe to run from several sidecars at once: SPOP hands each member to
-- exactly one call, and an entry whose deadline moved (reset_timeout) is left alone.
-- A due entry with a persisted record fails with reason 'timeout'; one without is an
-- orphan (XORs of a retired or unknown id) and is dropped.
-- Returns {processed, timed_out, orphans, more (1 if due entries remain)}.

local limit, max_replays = tonumber(ARGV[1]), tonumber(ARGV[2])
local processed, timed_out, orphans = 0, 0, 0
while processed < limit do
  local due = redis.call('ZRANGEBYSCORE', TIDX, '-inf', NOW, 'LIMIT', 0, 1)
  if #due == 0 then break end
  local deadline = tonumber(due[1])
  local key = tmo_key(deadline)
  local members = redis.call('SPOP', key, limit - processed)
  for _, src in ipairs(members) do
    processed = processed + 1
    local entry = redis.call('HGET', ACKS, src)
    if entry then
      local _, _, dl = struct.unpack(ENTRY, entry)
      if dl == deadline then
        if redis.call('HEXISTS', REC, src) == 1 then
          fail_record(src, 'timeout', '', max_replays)
          timed_out = timed_out + 1
        else
          redis.call('HDEL', ACKS, src)
          count('orphans')
          orphans = orphans + 1
        end
      end
    end
  end
  if redis.call('SCARD', key) == 0 then redis.call('ZREM', TIDX, due[1]) end
end
local more = #redis.call('ZRANGEBYSCORE', TIDX, '-inf', NOW, 'LIMIT', 0, 1)
flush_counts()
return {processed, timed_out, orphans, more}
