-- FTLayer.fail from outside a task flush (operators, the sidecar, tests).
-- ARGV: max_replays (-1: each record's own budget), fails (as fail_packed in _common.lua).
-- Returns {replayed, dead_lettered, orphans}.

local done = fail_packed(ARGV[2], tonumber(ARGV[1]))
flush_counts()
return done
