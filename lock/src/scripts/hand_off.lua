-- Prelude shared by acquire.lua, release.lua, cancel.lua and raise_fencing.lua (prepended
-- to each).
--
-- Every lock has four keys, all tagged {key} so they share a cluster slot:
--   the lock      "<owner>:<fencing token>:<note>", expiring with the lease; <owner> is
--                 the holder's owner token, always 32 hex digits; <note> is whatever the
--                 holder said it is doing (may be empty)
--   the counter   the fencing counter: starts from the clock (see grant), then INCR on
--                 every grant, never lowered; expires the key's idle time after the
--                 last lease it counted ends (or after a raise), so a key nobody locks
--                 any more leaves nothing behind (see keep_counter)
--   the queue     a sorted set of waiting owners, scored by arrival: first come, first
--                 served; joining, leaving and serving cost O(log n), so a crowd of
--                 waiters that gives up at once costs the server little
--   the waiters   a hash from each waiting owner to "<ttl ms>|<deadline>|<channel>|<note>":
--                 the lease it asked for, the Redis-clock time (ms) after which it has
--                 given up, the pub/sub channel its process listens on (never contains
--                 '|'; in a cluster a sharded channel tagged with this lock's slot), and
--                 its note; field '#' counts arrivals (the queue's scores)

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Numbers as decimal digits: Lua's own conversion writes 1e+14 from 10^14 on.
local function digits(n)
  return string.format('%.0f', n)
end

-- A counter that does not exist — a new key, or one the server lost with its data (a
-- restart without persistence, an eviction) — starts from the server's clock in
-- microseconds. Every token is then at most the clock at its grant (a key is granted at
-- most once per microsecond; a raised counter only reaches a token granted earlier), so
-- a counter that starts again after losing its data starts above every token it handed
-- out before: no two grants of a key carry the same token, as long as the server's clock
-- does not step back across the loss. (The protected store's fencing check does not rely
-- on this: it refuses a token that is not newer than the last one it accepted.)
local function clock_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function next_fence(fence_key)
  if redis.call('EXISTS', fence_key) == 1 then
    return redis.call('INCR', fence_key)
  end
  local fence = clock_us()
  redis.call('SET', fence_key, digits(fence))
  return fence
end

-- The counter lives `idle_ms` past the lease `ttl` just granted or renewed: a key locked
-- once (an order) leaves no state for longer than that. Forgetting it is safe for the
-- reason above: it starts again from the clock, and the protected store refuses a token
-- that is not newer anyway.
local function keep_counter(fence_key, ttl, idle_ms)
  redis.call('PEXPIRE', fence_key, digits(tonumber(ttl) + tonumber(idle_ms)))
end

local function grant(lock_key, fence_key, owner, ttl, note, idle_ms)
  local fence = next_fence(fence_key)
  redis.call('SET', lock_key, owner .. ':' .. digits(fence) .. ':' .. note, 'PX', ttl)
  keep_counter(fence_key, ttl, idle_ms)
  return fence
end

-- Tells a waiter's process on its channel, and answers how many subscribers received it.
-- A channel with a hash tag is a sharded one (a Redis Cluster: it hashes to this lock's
-- slot, so SPUBLISH runs here and counts exactly); one without is a plain channel (one
-- server: PUBLISH).
local function publish(channel, message)
  if string.find(channel, '{', 1, true) then
    return redis.call('SPUBLISH', channel, message)
  end
  return redis.call('PUBLISH', channel, message)
end

-- Gives a free lock to the first waiter whose deadline has not passed and whose process
-- still listens, and tells it on its channel — unless it is `quiet_owner` (the caller,
-- who learns from the script's reply). Publishing answers how many subscribers received
-- the message: none means the waiter's process is gone (its connection closed), and the
-- lock would sit with a dead waiter for a whole lease, so it is taken back and the next
-- waiter is served. `idle_ms` is how long the counter outlives the new lease. Returns the
-- new holder's owner token and fencing token, or nil when nobody is waiting.
local function hand_off(lock_key, fence_key, queue_key, waiters_key, quiet_owner, idle_ms)
  local now
  while true do
    local first = redis.call('ZPOPMIN', queue_key)
    if #first == 0 then
      return nil
    end
    local owner = first[1]
    local waiter = redis.call('HGET', waiters_key, owner)
    redis.call('HDEL', waiters_key, owner)
    local ttl, deadline, channel, note
    if waiter then
      ttl, deadline, channel, note = string.match(waiter, '^(%d+)|(%d+)|([^|]+)|(.*)$')
    end
    now = now or now_ms()
    if ttl and tonumber(deadline) > now then
      local fence = grant(lock_key, fence_key, owner, ttl, note, idle_ms)
      if owner == quiet_owner then
        return owner, fence
      end
      if publish(channel, owner .. ':' .. digits(fence)) > 0 then
        return owner, fence
      end
      redis.call('DEL', lock_key)
    end
  end
end
