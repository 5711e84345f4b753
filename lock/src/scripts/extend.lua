-- Restart a lease's TTL if the caller still holds the lock.
-- KEYS[1]  the lock
-- ARGV[1]  the caller's owner token
-- ARGV[2]  the new TTL, ms
-- Returns 1 when extended, 0 when the lock is gone or another's.

local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
