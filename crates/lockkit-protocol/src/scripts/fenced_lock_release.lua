-- fenced_lock_release: give back one hold of a fenced lock.
--
-- KEYS[1]  lock key (see fenced_lock_acquire.lua)
-- KEYS[2]  token counter (not touched: only acquisitions mint tokens)
-- KEYS[3]  handoff key (see lock_release.lua)
-- KEYS[4]  waiting key (see lock_release.lua)
-- KEYS[5]  timeouts key (see lock_release.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  channel on which the unlock is announced
-- ARGV[3]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    as lock_release.lua: {1, 0} freed and announced; {2, n} the owner still holds n;
--          {0, 0} the hold was not there (its own lease ran out, force-unlocked, released
--          already); as there, a release that woke waiters reserves the lock for the one waiting
--          longest, for the handoff window. The hold's token field goes with its marker.
local key, handoff, waiting, timeouts = KEYS[1], KEYS[3], KEYS[4], KEYS[5]
local marker, channel, sharded = ARGV[1], ARGV[2], ARGV[3]
return release_hold(key, handoff, waiting, timeouts, marker, channel, sharded)
