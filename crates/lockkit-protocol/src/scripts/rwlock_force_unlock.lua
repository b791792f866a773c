-- rwlock_force_unlock: delete a read-write lock whoever holds it, and grant it to its line.
-- Administrative.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries
-- KEYS[3]  waiting ZSET (the line, see rwlock_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  the lock's channel (not used: a grant goes to the waiting client's own channel)
-- ARGV[2]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} the lock was held and was deleted; {0} it was free (holds that had run out do not
--          count)
--
-- The lock then goes to the line as after a release (rwlock_lib.lua, grant_line).

local key, expiries, waiting, timeouts, sharded = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2]
local now = now_ms()
purge(key, expiries, now)
if redis.call('DEL', key, expiries) == 0 then
  return {0}
end
grant_line(key, expiries, waiting, timeouts, sharded, now, nil)
return {1}
