-- lock_cancel: take an owner that stopped waiting (its wait timed out, its acquire future was
-- dropped, its client shut down) out of a lock's or fenced lock's waiting set, and hand on a
-- reservation it was given.
--
-- KEYS[1]  lock key (see lock_acquire.lua; only checked for existence)
-- KEYS[2]  handoff key (see lock_acquire.lua)
-- KEYS[3]  waiting key (see lock_acquire.lua)
-- KEYS[4]  timeouts key (see lock_acquire.lua)
-- ARGV[1]  owner id that stopped waiting
-- ARGV[2]  channel on which the next waiter is named
-- ARGV[3]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    {1} the owner was waiting (or reserved for) and is removed; {0} it was not
--
-- When a release had reserved the free lock for this owner, the reservation ends at once and the
-- release is announced again (lock_release.lua): the longest waiting owner still waiting gets
-- the reservation and is named, or, with nobody waiting, the lock is anyone's. Idempotent: a
-- second run finds nothing to remove.
local key, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, channel, sharded = ARGV[1], ARGV[2], ARGV[3]

local removed = redis.call('ZREM', timeouts, owner) + redis.call('ZREM', waiting, owner)
if redis.call('GET', handoff) == owner then
  redis.call('DEL', handoff)
  if redis.call('EXISTS', key) == 0 then
    announce_release(handoff, waiting, timeouts, channel, sharded, now_ms())
  end
  removed = 1
end
if removed > 0 then
  return {1}
end
return {0}
