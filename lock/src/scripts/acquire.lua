-- Take a lock, or join its first-come-first-served queue, in one round trip.
-- KEYS[1]  the lock          KEYS[2]  its fencing counter      KEYS[3]  its wait queue
-- ARGV[1]  the caller's owner token (32 hex digits)
-- ARGV[2]  the lease TTL, ms
-- ARGV[3]  how long the caller will wait, ms; 0 = try once, never queue
-- ARGV[4]  the caller's wake-up channel
-- ARGV[5]  the caller's queue entry from an earlier reply, or '' on a first attempt
--          (a waiter holds one entry at most: it is found again by this exact string)
-- ARGV[6]  the caller's note: what it will be doing while it holds the lock (may be '')
-- Returns {1, fencing token, ''} when the lock is now the caller's, else
--         {0, ms until the current lease ends, the caller's queue entry or ''}.

local lock_key, fence_key, queue_key = KEYS[1], KEYS[2], KEYS[3]
local owner, ttl, wait_ms, channel, entry, note =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]

local current = redis.call('GET', lock_key)
if current then
  if string.sub(current, 1, 32) == owner then
    -- Handed to us while our wake-up was still in flight: take it, with a full lease.
    redis.call('PEXPIRE', lock_key, ttl)
    return {1, tonumber(string.match(current, '^%x+:(%d+)')), ''}
  end
elseif redis.call('LLEN', queue_key) == 0 then
  -- The common case: free, nobody waiting.
  return {1, grant(lock_key, fence_key, owner, ttl, note), ''}
else
  -- Free, but others queued first (their holder expired without a release, or a wake-up
  -- was lost): serve the queue in order. The caller may be at its head.
  local next_owner, fence = hand_off(lock_key, fence_key, queue_key, owner)
  if next_owner == owner then
    return {1, fence, ''}
  elseif not next_owner then
    -- Every queued waiter had given up.
    return {1, grant(lock_key, fence_key, owner, ttl, note), ''}
  end
end

if wait_ms > 0 then
  if entry == '' or not redis.call('LPOS', queue_key, entry) then
    entry = owner .. '|' .. ttl .. '|' .. digits(now_ms() + wait_ms) .. '|' .. channel .. '|' .. note
    redis.call('RPUSH', queue_key, entry)
  end
else
  entry = ''
end
return {0, redis.call('PTTL', lock_key), entry}
