-- A waiter gives up — at its deadline, or because its call was abandoned or failed after
-- the acquire script may have run: it leaves the queue, and if the lock was handed to it
-- meanwhile, it passes the lock on. O(log n) in the queue's length.
-- KEYS[1]  the lock     KEYS[2]  its fencing counter     KEYS[3]  its queue
-- KEYS[4]  its waiters
-- ARGV[1]  the caller's owner token
-- ARGV[2]  how long the counter outlives a lease handed on, ms (the key's idle time)
-- Returns 1 when the lock had been handed to the caller (and was passed on), else 0.

redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], nil, ARGV[2])
  return 1
end
return 0
