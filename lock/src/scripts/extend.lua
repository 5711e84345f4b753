-- Restart a lease's TTL if the caller still holds the lock, and keep its fencing counter
-- for the key's idle time past the new lease (a lock held longer than that keeps its
-- counter).
-- KEYS[1]  the lock     KEYS[2]  its fencing counter
-- ARGV[1]  the caller's owner token
-- ARGV[2]  the new TTL, ms
-- ARGV[3]  how long the counter outlives the lease, ms (the key's idle time)
-- Returns 1 when extended, 0 when the lock is gone or another's.

local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], string.format('%.0f', tonumber(ARGV[2]) + tonumber(ARGV[3])))
  return 1
end
return 0
