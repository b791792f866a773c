-- lock_force_unlock: delete a lock whoever holds it, and wake its waiters. Administrative.
--
-- KEYS[1]  lock key
-- ARGV[1]  channel on which the unlock is announced
-- ARGV[2]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    {1} the lock existed and was deleted; {0} it was not locked
local key, channel, sharded = KEYS[1], ARGV[1], ARGV[2]

if redis.call('DEL', key) == 0 then
  return {0}
end
if sharded == '1' then
  redis.pcall('SPUBLISH', channel, 'one')
else
  redis.pcall('PUBLISH', channel, 'one')
end
return {1}
