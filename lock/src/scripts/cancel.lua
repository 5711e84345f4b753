-- A waiter gives up: it leaves the queue, and if the lock was handed to it meanwhile, it
-- passes the lock on.
-- KEYS[1]  the lock          KEYS[2]  its fencing counter      KEYS[3]  its wait queue
-- ARGV[1]  the caller's owner token
-- ARGV[2]  the caller's queue entry, or '' if it never queued
-- Returns 1 when the lock had been handed to the caller (and was passed on), else 0.

if ARGV[2] ~= '' then
  redis.call('LREM', KEYS[3], 1, ARGV[2])
end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  hand_off(KEYS[1], KEYS[2], KEYS[3], nil)
  return 1
end
return 0
