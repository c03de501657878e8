-- A task of a vectorized batch behind a shuffle stores its summary (see put_summary in
-- core/summaries.lua), unless its run settled the batch already (a late speculative or zombie
-- attempt: its summary would never be read, nor deleted).
-- ARGV: summary key suffix (token, hex), summary, summary_ttl_ms, run salt, batch prefix.
-- Returns 1 stored, 0 not.

if batch_settled(ARGV[5], ARGV[4]) then return 0 end
put_summary(ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[5])
return 1
