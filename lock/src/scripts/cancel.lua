-- A waiter gives up — at its deadline, or because its call was abandoned or failed after
-- the acquire script may have run: it leaves the queue, and if the lock was handed to it
-- meanwhile, it passes the lock on.
-- KEYS[1]  the lock          KEYS[2]  its fencing counter      KEYS[3]  its wait queue
-- ARGV[1]  the caller's owner token
-- Returns 1 when the lock had been handed to the caller (and was passed on), else 0.

-- By owner token rather than by exact entry: the caller may never have seen the reply
-- that told it its entry. Queues are short.
for _, entry in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  if string.sub(entry, 1, 32) == ARGV[1] then
    redis.call('LREM', KEYS[3], 0, entry)
  end
end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  hand_off(KEYS[1], KEYS[2], KEYS[3], nil)
  return 1
end
return 0
