-- Prelude shared by acquire.lua, release.lua and cancel.lua (prepended to each).
--
-- Every lock has three keys, all tagged {key} so they share a cluster slot:
--   the lock      "<owner>:<fencing token>:<note>", expiring with the lease; <owner> is
--                 the holder's owner token, always 32 hex digits; <note> is whatever the
--                 holder said it is doing (may be empty)
--   the counter   the fencing counter: INCR on every grant, never lowered
--   the queue     a list of waiters in arrival order, each
--                 "<owner>|<ttl ms>|<deadline>|<channel>|<note>": the lease the waiter asked
--                 for, the Redis-clock time (ms) after which it has given up, the pub/sub
--                 channel its process listens on (never contains '|'), and its note

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Numbers as decimal digits: Lua's own conversion writes 1e+14 from 10^14 on.
local function digits(n)
  return string.format('%.0f', n)
end

local function grant(lock_key, fence_key, owner, ttl, note)
  local fence = redis.call('INCR', fence_key)
  redis.call('SET', lock_key, owner .. ':' .. digits(fence) .. ':' .. note, 'PX', ttl)
  return fence
end

-- Gives a free lock to the first waiter whose deadline has not passed and tells it on its
-- channel, unless it is `quiet_owner` (the caller, who learns from the script's reply).
-- Returns that waiter's owner token and fencing token, or nil when nobody is waiting.
local function hand_off(lock_key, fence_key, queue_key, quiet_owner)
  local now
  while true do
    local entry = redis.call('LPOP', queue_key)
    if not entry then
      return nil
    end
    local owner, ttl, deadline, channel, note =
      string.match(entry, '^(%x+)|(%d+)|(%d+)|([^|]+)|(.*)$')
    now = now or now_ms()
    if owner and tonumber(deadline) > now then
      local fence = grant(lock_key, fence_key, owner, ttl, note)
      if owner ~= quiet_owner then
        redis.call('PUBLISH', channel, owner .. ':' .. digits(fence))
      end
      return owner, fence
    end
  end
end
