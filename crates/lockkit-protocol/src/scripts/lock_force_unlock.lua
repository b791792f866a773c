-- lock_force_unlock: delete a lock whoever holds it, and hand it over to its longest-waiting
-- request. Administrative.
--
-- KEYS     every key of the object: a lock's [key, handoff, waiting, timeouts], a fenced lock's
--          [key, token counter, handoff, waiting, timeouts] (the counter is kept, with its expiry), a spin lock's
--          [key] (it has no waiting set: its waiters poll)
-- ARGV[1]  the lock's channel (not used: a grant goes to the waiting client's own channel)
-- ARGV[2]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[3]  optional, for a fenced lock: the token counter's TTL in ms, given to it again by a
--          grant's mint (see fenced_lock_acquire.lua)
--
-- Reply    {1} the lock existed and was deleted; {0} it was not locked
--
-- A reservation for a multi-lock member ends too. The lock then goes to the next request as after
-- a release (handoff_lib.lua, hand_over).
local key, sharded = KEYS[1], ARGV[2]
local bad_ttl = use_counter_ttl(ARGV[3])
if bad_ttl then
  return bad_ttl
end
if #KEYS < 4 then
  return {redis.call('DEL', key)}
end
if redis.call('DEL', key) == 0 then
  return {0}
end
if #KEYS == 5 then
  redis.call('DEL', KEYS[3])
  hand_over(key, KEYS[3], KEYS[4], KEYS[5], sharded, now_ms(), KEYS[2])
else
  -- KEYS[5] is absent (nil): a plain lock mints no tokens.
  redis.call('DEL', KEYS[2])
  hand_over(key, KEYS[2], KEYS[3], KEYS[4], sharded, now_ms(), KEYS[5])
end
return {1}
