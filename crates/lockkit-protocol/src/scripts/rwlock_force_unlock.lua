-- rwlock_force_unlock: delete a read-write lock whoever holds it, and wake every waiter.
-- Administrative.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries (see rwlock_acquire.lua)
-- ARGV[1]  channel on which the release is announced
-- ARGV[2]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} the lock was held and was deleted; {0} it was free (holds that had run out do not
--          count)

local key, expiries, channel, sharded = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
purge(key, expiries, now_ms())
if redis.call('DEL', key, expiries) == 0 then
  return {0}
end
if sharded == '1' then
  redis.pcall('SPUBLISH', channel, 'all')
else
  redis.pcall('PUBLISH', channel, 'all')
end
return {1}
