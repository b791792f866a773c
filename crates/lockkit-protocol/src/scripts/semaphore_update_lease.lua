-- semaphore_update_lease: set the lease of one live hold (a permit of a permit-expirable
-- semaphore) to end `lease` ms from now; it may end earlier than before.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- ARGV[1]  hold marker (the permit id)
-- ARGV[2]  new lease in milliseconds, counted from now (> 0)
-- ARGV[3]  channel on which permits that came back are announced
-- ARGV[4]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} updated; {0} the hold was not there (lease ended, released, or never existed)
local main, leases = KEYS[1], KEYS[2]
local marker, lease = ARGV[1], tonumber(ARGV[2])

local now = now_ms()
local returned = purge(main, leases, now)
local reply = {0}
if redis.call('ZSCORE', leases, marker) then
  redis.call('ZADD', leases, now + lease, marker)
  reply = {1}
end
announce(main, returned, ARGV[3], ARGV[4])
return reply
