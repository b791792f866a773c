-- semaphore_release: give back the permits of one hold (both semaphore kinds).
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- KEYS[3]  waiting ZSET (the line, see semaphore_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  hold marker of the hold to give back (for a permit-expirable semaphore: the permit id)
-- ARGV[2]  the semaphore's channel (not used: a grant goes to the waiting client's own channel)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, 0}  released; the permits went to the line's head while it fits, or are free
--          {0, 0}  the hold was not there: its lease ran out, it was released already (by this
--                  request's first run, or by id from elsewhere), or it never existed
--
-- Only a live hold is given back: the marker must be in the leases ZSET (which holds nothing
-- else), so an arbitrary id can never touch the `permits` or `used` fields. Permits that came
-- back (this hold's, and those of holds whose lease ran out) are granted to the line
-- (semaphore_lib.lua, grant_line): one message per granted call, nothing to anyone else.
local main, leases, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, sharded = ARGV[1], ARGV[3]

local now = now_ms()
purge(main, leases, now)
local reply = {0, 0}
if redis.call('ZSCORE', leases, marker) then
  end_hold(main, leases, marker)
  reply = {1, 0}
end
grant_line(main, leases, waiting, timeouts, sharded, now, nil)
return reply
