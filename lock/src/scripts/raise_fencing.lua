-- Raise a fencing counter to at least a floor; never lower it. After Redis lost its data
-- the store the lock protects reports the highest token it has accepted: raising the
-- counter to it keeps tokens increasing even if the server's clock stepped back. A
-- counter that does not exist starts from the clock first, as on a grant (see
-- next_fence): the floor only says what was accepted, not what was handed out.
-- KEYS[1]  the fencing counter
-- ARGV[1]  the floor
-- ARGV[2]  how long the counter is kept at least, ms (the key's idle time)
-- Returns the counter afterwards. (Floors are at most 2^53 - 2^32, checked by the caller,
-- so Lua's numbers hold them exactly.)

local current = tonumber(redis.call('GET', KEYS[1]) or clock_us())
local floor = tonumber(ARGV[1])
if current < floor then
  current = floor
end
-- Kept the idle time, or longer if a lease's grant already keeps it longer.
local keep = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[2]), 1)
redis.call('SET', KEYS[1], digits(current), 'PX', digits(keep))
return current
