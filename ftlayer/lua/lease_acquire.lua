-- Take or renew the sidecar lease. KEYS[1] lease key; ARGV: holder id, lease ms.
-- Returns 1 if the caller holds the lease now, else 0. A holder that stops renewing
-- loses it after the lease time; no other state depends on who holds it.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
