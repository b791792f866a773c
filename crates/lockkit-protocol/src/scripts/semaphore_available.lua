-- semaphore_available: how many permits are free (after giving back the expired ones).
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- KEYS[3]  waiting ZSET (the line, see semaphore_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  the semaphore's channel (not used)
-- ARGV[2]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, available, total}  the permits free now and the total
--          {0, 0, 0}              the permits were never set
--
-- Permits of holds whose lease ran out are granted to the line first (grant_line), so the
-- permits reported free are those nobody in the line can use: a request at the head that asks
-- for more than is free keeps them for itself (it is not overtaken).
local main, leases, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local now = now_ms()
purge(main, leases, now)
grant_line(main, leases, waiting, timeouts, ARGV[2], now, nil)
local total = tonumber(redis.call('HGET', main, 'permits'))
if total == nil then
  return {0, 0, 0}
end
return {1, available(main), total}
