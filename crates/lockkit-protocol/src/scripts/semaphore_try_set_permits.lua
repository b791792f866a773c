-- semaphore_try_set_permits: set a semaphore's total permits, only if they were never set.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET (unused; every key of the object is passed)
-- ARGV[1]  the total number of permits (>= 0)
--
-- Reply    {1} set; {0} the permits were set already (nothing changed)
return {redis.call('HSETNX', KEYS[1], 'permits', ARGV[1])}
