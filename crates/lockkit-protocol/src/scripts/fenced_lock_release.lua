-- fenced_lock_release: give back one hold of a fenced lock.
--
-- KEYS[1]  lock key (see fenced_lock_acquire.lua)
-- KEYS[2]  token counter (not touched: tokens only grow)
-- KEYS[3]  handoff key (see lock_release.lua)
-- KEYS[4]  waiting key (see lock_release.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  channel on which the unlock is announced
-- ARGV[3]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    as lock_release.lua: {1, 0} freed and announced; {2, n} the owner still holds n;
--          {0, 0} the hold was not there; as there, a release that woke waiters reserves the
--          lock for the one waiting longest, for the handoff window
local key, handoff, waiting = KEYS[1], KEYS[3], KEYS[4]
local marker, channel, sharded = ARGV[1], ARGV[2], ARGV[3]

local owner = redis.call('HGET', key, marker)
if not owner then
  return {0, 0}
end
local count = redis.call('HINCRBY', key, owner, -1)
if count > 0 then
  redis.call('HDEL', key, marker, marker .. ':token')
  return {2, count}
end
redis.call('DEL', key)
announce_release(handoff, waiting, channel, sharded)
return {1, 0}
