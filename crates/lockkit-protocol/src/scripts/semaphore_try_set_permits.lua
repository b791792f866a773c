-- semaphore_try_set_permits: set a semaphore's total permits, only if they were never set.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- ARGV[1]  the total number of permits (>= 0)
--
-- Reply    {1} set; {0} the permits were set already (nothing changed)
--
-- Holds left in the leases ZSET by an evicted main HASH are dropped first (`repair_eviction`):
-- the new total must not count from zero while they still hold permits.
repair_eviction(KEYS[1], KEYS[2])
return {redis.call('HSETNX', KEYS[1], 'permits', ARGV[1])}
