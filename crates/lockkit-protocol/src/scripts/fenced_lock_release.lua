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
-- The handoff window in ms (lockkit_protocol::lock::HANDOFF_WINDOW).
local HANDOFF_WINDOW_MS = 10

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
-- Every client wakes one of its waiters; the client of the longest waiting owner wakes that one.
local first = redis.call('ZRANGE', waiting, 0, 0)[1]
local message = 'one'
if first then
  message = 'p:' .. first
end
local woken
if sharded == '1' then
  woken = redis.pcall('SPUBLISH', channel, message)
else
  woken = redis.pcall('PUBLISH', channel, message)
end
if first then
  -- The head leaves the set: it gets the reservation, or nobody is subscribed and it is gone.
  redis.call('ZREM', waiting, first)
  if type(woken) == 'number' and woken > 0 then
    redis.call('SET', handoff, first, 'PX', HANDOFF_WINDOW_MS)
  end
end
return {1, 0}
