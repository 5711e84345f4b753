-- Take a lock, or join its first-come-first-served queue, in one round trip.
-- KEYS[1]  the lock     KEYS[2]  its fencing counter     KEYS[3]  its queue
-- KEYS[4]  its waiters
-- ARGV[1]  the caller's owner token (32 hex digits)
-- ARGV[2]  the lease TTL, ms
-- ARGV[3]  how long the caller will wait, ms; 0 = try once, never queue
-- ARGV[4]  the caller's wake-up channel
-- ARGV[5]  the caller's note: what it will be doing while it holds the lock (may be '')
-- ARGV[6]  the most waiters the queue takes
-- ARGV[7]  how long the counter outlives the lease, ms (the key's idle time)
-- Returns {1, fencing token} when the lock is now the caller's,
--         {0, ms until the current lease ends} when it is held (the caller is queued if
--                                               it waits),
--         {-1, ms until the current lease ends} when the queue is full (not queued).

local lock_key, fence_key, queue_key, waiters_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, wait_ms, channel, note, max_waiters, idle_ms =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7]

local current = redis.call('GET', lock_key)
if current then
  if string.sub(current, 1, 32) == owner then
    -- Handed to us while our wake-up was still in flight: take it, with a full lease.
    redis.call('PEXPIRE', lock_key, ttl)
    keep_counter(fence_key, ttl, idle_ms)
    return {1, tonumber(string.match(current, '^%x+:(%d+)'))}
  end
elseif redis.call('ZCARD', queue_key) == 0 then
  -- The common case: free, nobody waiting.
  return {1, grant(lock_key, fence_key, owner, ttl, note, idle_ms)}
else
  -- Free, but others queued first (their holder expired without a release, or a wake-up
  -- was lost): serve the queue in order. The caller may be at its head.
  local next_owner, fence = hand_off(lock_key, fence_key, queue_key, waiters_key, owner, idle_ms)
  if next_owner == owner then
    return {1, fence}
  elseif not next_owner then
    -- Every queued waiter had given up.
    return {1, grant(lock_key, fence_key, owner, ttl, note, idle_ms)}
  end
end

-- Forgets waiters whose deadline passed without a cancel (their process died): they
-- must not hold places under the cap. Runs only when the queue looks full, over at most
-- that many entries.
local function drop_expired()
  local now = now_ms()
  for _, waiting in ipairs(redis.call('ZRANGE', queue_key, 0, -1)) do
    local waiter = redis.call('HGET', waiters_key, waiting)
    local deadline = waiter and tonumber(string.match(waiter, '^%d+|(%d+)|'))
    if not deadline or deadline <= now then
      redis.call('ZREM', queue_key, waiting)
      redis.call('HDEL', waiters_key, waiting)
    end
  end
end

if wait_ms > 0 and not redis.call('ZSCORE', queue_key, owner) then
  if redis.call('ZCARD', queue_key) >= max_waiters then
    drop_expired()
    if redis.call('ZCARD', queue_key) >= max_waiters then
      return {-1, redis.call('PTTL', lock_key)}
    end
  end
  local deadline = now_ms() + wait_ms
  redis.call('ZADD', queue_key, redis.call('HINCRBY', waiters_key, '#', 1), owner)
  redis.call('HSET', waiters_key, owner,
    ttl .. '|' .. digits(deadline) .. '|' .. channel .. '|' .. note)
  -- Waiters that die without cancelling are dropped when served or under the cap; keys
  -- nobody touches again go away by themselves once every deadline has passed.
  local keep = wait_ms + 60000
  for _, key in ipairs({queue_key, waiters_key}) do
    if redis.call('PTTL', key) < keep then
      redis.call('PEXPIRE', key, keep)
    end
  end
end
return {0, redis.call('PTTL', lock_key)}
