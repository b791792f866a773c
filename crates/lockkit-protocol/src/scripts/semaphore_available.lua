-- semaphore_available: how many permits are free (after giving back the expired ones).
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- ARGV[1]  channel on which permits that came back are announced
-- ARGV[2]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, available, total}  the permits free now and the total
--          {0, 0, 0}              the permits were never set
local main, leases = KEYS[1], KEYS[2]

local returned = purge(main, leases, now_ms())
announce(main, returned, ARGV[1], ARGV[2])
local total = tonumber(redis.call('HGET', main, 'permits'))
if total == nil then
  return {0, 0, 0}
end
return {1, available(main), total}
