-- semaphore_try_set_permits: set a semaphore's total permits, only if they were never set.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- KEYS[3]  waiting ZSET (the line, see semaphore_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  the total number of permits (>= 0)
-- ARGV[2]  the semaphore's channel (not used)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} set; {0} the permits were set already (nothing changed)
--
-- Holds left in the leases ZSET by an evicted main HASH are dropped first (`repair_eviction`):
-- the new total must not count from zero while they still hold permits. Requests can only be in
-- the line with the total absent after its data was lost: a total set here refuses each one that
-- asks for more (refuse_impossible) and grants the line's head while it fits (grant_line).
local main, leases, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
repair_eviction(main, leases)
local set = redis.call('HSETNX', main, 'permits', ARGV[1])
if set == 1 then
  local now = now_ms()
  refuse_impossible(main, waiting, timeouts, ARGV[3], now)
  grant_line(main, leases, waiting, timeouts, ARGV[3], now, nil)
end
return {set}
