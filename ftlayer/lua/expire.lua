-- Expire due entries of one shard, a bucket at a time, until about ARGV[1] entries were
-- looked at (chunks keep Redis responsive with a million pending records). ARGV: limit,
-- max_replays (-1: each record's own budget, from its frame; >= 0: an override).
-- Idempotent and safe to run from several sidecars at once: SPOP hands each bucket of a
-- deadline to exactly one call, and only entries whose own deadline has passed are
-- touched (one whose deadline moved, reset_timeout, is left for its new deadline).
-- A due entry with a frame fails with reason 'timeout' (fail_one, once every due entry
-- was found); one without is an orphan (XORs of a retired or unknown id) and is dropped.
-- Returns {processed, timed_out, orphans, more (1 if due entries remain)}.

local limit, max_replays = tonumber(ARGV[1]), tonumber(ARGV[2])
local processed, timed_out, orphans = 0, 0, 0
local bs, slots, offs = {}, {}, {} -- the due records with a frame: bucket, slot, offset
while processed < limit do
  local due = redis.call('ZRANGEBYSCORE', TIDX, '-inf', NOW, 'LIMIT', 0, 1)
  if #due == 0 then break end
  local key = tmo_key(tonumber(due[1]))
  local keys = redis.call('SPOP', key, math.max(1, math.ceil((limit - processed) / 64)))
  for _, bkey in ipairs(keys) do
    local b = bucket_of_key(bkey)
    b.expired = b.expired or {} -- a bucket can come up under two deadlines in one call
    for slot = 0, slots_of(b) - 1 do
      local hi, _, dl, _, off = get(b, slot)
      if hi and not b.expired[slot] then
        if dl > 0 and dl <= NOW then
          processed = processed + 1
          b.expired[slot] = true
          if off ~= NOFRAME then
            timed_out = timed_out + 1
            bs[timed_out], slots[timed_out], offs[timed_out] = b, slot, off
          else
            remove(b, slot)
            count('orphans')
            orphans = orphans + 1
          end
        end
      end
    end
  end
  if redis.call('SCARD', key) == 0 then redis.call('ZREM', TIDX, due[1]) end
end
for i = 1, timed_out do
  fail_one(false, bs[i], slots[i], offs[i], 'timeout', '', max_replays)
end
commit_failures()
local more = #redis.call('ZRANGEBYSCORE', TIDX, '-inf', NOW, 'LIMIT', 0, 1)
flush_counts()
return {processed, timed_out, orphans, more}
