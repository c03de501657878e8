-- FTLayer.fail from outside a task flush (operators, the sidecar, tests).
-- ARGV: max_replays (-1: each record's own budget), fails (as parse_fails in core/failures.lua),
-- and optionally hold_until (ms: when the records failed with reason 'held' may be claimed).
-- Returns {replayed, dead_lettered, orphans}.

local done = fail_records(parse_fails(ARGV[2], tonumber(ARGV[1])), tonumber(ARGV[3] or '0'))
commit_failures()
flush_counts()
return done
