-- Release a lock the caller still holds and hand it to the next waiter.
-- KEYS[1]  the lock     KEYS[2]  its fencing counter     KEYS[3]  its queue
-- KEYS[4]  its waiters
-- ARGV[1]  the caller's owner token
-- ARGV[2]  how long the counter outlives a lease handed on, ms (the key's idle time)
-- Returns 1 when the caller held the lock, 0 when not (expired, or another holder's, which
-- is left untouched).

local current = redis.call('GET', KEYS[1])
if not current then
  -- Expired under us. Waiters would find out when the lease they saw runs out; tell the
  -- next one now.
  hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], nil, ARGV[2])
  return 0
end
if string.sub(current, 1, 32) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], nil, ARGV[2])
return 1
