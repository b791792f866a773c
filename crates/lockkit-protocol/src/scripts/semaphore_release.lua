-- semaphore_release: give back the permits of one hold (both semaphore kinds).
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- ARGV[1]  hold marker of the hold to give back (for a permit-expirable semaphore: the permit id)
-- ARGV[2]  channel on which the permits that came back are announced ('n:<k>')
-- ARGV[3]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, 0}  released and announced
--          {0, 0}  the hold was not there: its lease ran out, it was released already (by this
--                  request's first run, or by id from elsewhere), or it never existed
--
-- Only a live hold is given back: the marker must be in the leases ZSET (which holds nothing
-- else), so an arbitrary id can never touch the `permits` or `used` fields.
local main, leases = KEYS[1], KEYS[2]
local marker, channel, sharded = ARGV[1], ARGV[2], ARGV[3]

local returned = purge(main, leases, now_ms())
local reply = {0, 0}
if redis.call('ZSCORE', leases, marker) then
  local k = tonumber(redis.call('HGET', main, marker)) or 0
  redis.call('HDEL', main, marker)
  redis.call('ZREM', leases, marker)
  give_back(main, k)
  returned = returned + k
  reply = {1, 0}
end
announce(main, returned, channel, sharded)
return reply
