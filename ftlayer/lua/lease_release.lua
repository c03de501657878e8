-- Give the lease up if the caller holds it. KEYS[1] lease key; ARGV: holder id.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
