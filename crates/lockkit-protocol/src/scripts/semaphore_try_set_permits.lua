-- semaphore_try_set_permits: set a semaphore's total permits, only if they were never set.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- ARGV[1]  the total number of permits (>= 0)
-- ARGV[2]  channel on which the new total is announced ('all')
-- ARGV[3]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} set; {0} the permits were set already (nothing changed)
--
-- Holds left in the leases ZSET by an evicted main HASH are dropped first (`repair_eviction`):
-- the new total must not count from zero while they still hold permits. A total set here is
-- announced to every waiter ('all'): waiters can only be waiting on an absent total after its
-- data was lost, and each must learn at once whether the new total serves or refuses it.
repair_eviction(KEYS[1], KEYS[2])
local set = redis.call('HSETNX', KEYS[1], 'permits', ARGV[1])
if set == 1 then
  announce_total_changed(ARGV[2], ARGV[3])
end
return {set}
