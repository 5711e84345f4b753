-- Raise a fencing counter to at least a floor; never lower it. After Redis lost its data
-- the counter restarts at 0, and the store the lock protects reports the highest token it
-- has accepted: raising the counter to it keeps tokens increasing.
-- KEYS[1]  the fencing counter
-- ARGV[1]  the floor
-- Returns the counter afterwards. (Floors are at most 2^53 - 2^32, checked by the caller, so Lua's
-- numbers hold them exactly.)

local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
if current < floor then
  redis.call('SET', KEYS[1], ARGV[1])
  return floor
end
return current
