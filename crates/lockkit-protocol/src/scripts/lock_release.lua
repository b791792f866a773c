-- lock_release: give back one hold of a reentrant lock.
--
-- KEYS[1]  lock key (see lock_acquire.lua)
-- KEYS[2]  handoff key (see lock_acquire.lua)
-- KEYS[3]  waiting key (see lock_acquire.lua)
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
--
-- Handoff: when the announcement reached a subscriber (someone waits), the free lock is reserved
-- for the handoff window for the owner that has waited longest, who leaves the waiting set. The
-- message (`p:<owner>`) names it, so its client wakes that very waiter; every other client wakes
-- one waiter too (it is refused and waits again), so the lock is never stranded when the reserved
-- owner's client is gone. Why reserve: Redis writes a message to the newest subscriber first, and
-- an owner that locks again right after unlocking needs no message at all, so without it the
-- newest waiters win every race and the oldest starve. A reserved waiter that does not come
-- within the window (it gave up, or its client died) has lost its place, and the lock is
-- anyone's again.
local key, handoff, waiting = KEYS[1], KEYS[2], KEYS[3]
local marker, channel, sharded = ARGV[1], ARGV[2], ARGV[3]

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
announce_release(handoff, waiting, channel, sharded)
return {1, 0}
