-- core/summaries.lua -- task summaries of the batch scope (ftlayer/segments.py): stored
-- under their token, indexed by their batch, deleted with its settlement.
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
