-- semaphore_update_lease: set the lease of one live hold (a permit of a permit-expirable
-- semaphore) to end `lease` ms from now; it may end earlier than before.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- KEYS[3]  waiting ZSET (the line, see semaphore_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  hold marker (the permit id)
-- ARGV[2]  new lease in milliseconds, counted from now (> 0)
-- ARGV[3]  the semaphore's channel (not used)
-- ARGV[4]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} updated; {0} the hold was not there (lease ended, released, or never existed)
--
-- Permits of holds whose lease ran out are granted to the line (grant_line).
local main, leases, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, lease = ARGV[1], tonumber(ARGV[2])

local now = now_ms()
purge(main, leases, now)
local reply = {0}
if redis.call('ZSCORE', leases, marker) then
  redis.call('ZADD', leases, now + lease, marker)
  reply = {1}
end
grant_line(main, leases, waiting, timeouts, ARGV[4], now, nil)
return reply
