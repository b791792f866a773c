-- fenced_lock_release: give back one hold of a fenced lock.
--
-- KEYS[1]  lock key (see fenced_lock_acquire.lua)
-- KEYS[2]  token counter (a grant to the next waiting request mints its token)
-- KEYS[3]  handoff key (see lock_release.lua)
-- KEYS[4]  waiting key (see lock_release.lua)
-- KEYS[5]  timeouts key (see lock_release.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  the lock's channel (not used, see lock_release.lua)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[4]  optional: the token counter's TTL in ms, given to it again by a grant's mint (see
--          fenced_lock_acquire.lua)
--
-- Reply    as lock_release.lua: {1, 0} freed and announced; {2, n} the owner still holds n;
--          {0, 0} the hold was not there (its own lease ran out, force-unlocked, released
--          already); as there, a release that frees the lock hands it over to the longest-waiting
--          request, minting the grant's token. The hold's token field goes with its marker.
local key, counter, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local marker, sharded = ARGV[1], ARGV[3]
local bad_ttl = use_counter_ttl(ARGV[4])
if bad_ttl then
  return bad_ttl
end
return release_hold(key, handoff, waiting, timeouts, marker, sharded, counter)
