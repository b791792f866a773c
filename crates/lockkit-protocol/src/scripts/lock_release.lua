-- lock_release: give back one hold of a reentrant lock.
--
-- KEYS[1]  lock key (see lock_acquire.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  channel on which the unlock is announced
-- ARGV[3]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    {1, 0}           released; the lock is now free and the unlock was announced
--          {2, hold_count}  released; the same owner still holds hold_count holds
--          {0, 0}           the hold was not there: its lease ran out, the lock was force-unlocked,
--                           or this very hold was released already
--
-- The owner is read from the marker, so only the hold that was taken can be given back.
-- The TTL is left as it is: the holds that remain keep their own leases.
local key, marker, channel, sharded = KEYS[1], ARGV[1], ARGV[2], ARGV[3]

local owner = redis.call('HGET', key, marker)
if not owner then
  return {0, 0}
end
local count = redis.call('HINCRBY', key, owner, -1)
if count > 0 then
  redis.call('HDEL', key, marker)
  return {2, count}
end
-- The owner's last hold; in an exclusive lock no other owner can be in the hash.
redis.call('DEL', key)
if sharded == '1' then
  redis.pcall('SPUBLISH', channel, 'one')
else
  redis.pcall('PUBLISH', channel, 'one')
end
return {1, 0}
