-- lock_cancel: take a request whose call stopped waiting (its wait timed out, its acquire future
-- was dropped, its client shut down) out of a lock's or fenced lock's waiting set, and hand on
-- what a release gave it.
--
-- KEYS[1]  lock key (see lock_acquire.lua)
-- KEYS[2]  handoff key (see lock_acquire.lua)
-- KEYS[3]  waiting key (see lock_acquire.lua)
-- KEYS[4]  timeouts key (see lock_acquire.lua)
-- KEYS[5]  optional: the fenced lock's token counter (a grant to the next request mints a token)
-- ARGV[1]  the request that stopped waiting (`<marker> <lease> <owner> <channel>`)
-- ARGV[2]  the lock's channel (not used)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[4]  optional, with KEYS[5]: the token counter's TTL in ms, given to it again by a grant's
--          mint (see fenced_lock_acquire.lua)
--
-- Reply    {1} the request was waiting, granted or reserved for, and is removed; {0} it was not
--
-- A grant a release made to the request that its client did not claim (the call gave up while the
-- grant was on its way) is given back at once, and a reservation made for its owner ends: either
-- way the lock goes to the next request (handoff_lib.lua, hand_over), or is free. A lock found
-- free and reserved for nobody while requests wait (a reservation lapsed unused) goes to the next
-- request too. Idempotent: a second run finds nothing to remove.
local key, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local member, sharded = ARGV[1], ARGV[3]
local bad_ttl = use_counter_ttl(ARGV[4])
if bad_ttl then
  return bad_ttl
end
return cancel_request(key, handoff, waiting, timeouts, member, sharded, KEYS[5])
