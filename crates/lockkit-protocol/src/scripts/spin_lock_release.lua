-- spin_lock_release: compare-and-delete.
--
-- KEYS[1]  lock key (see spin_lock_acquire.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  channel (unused: spin locks announce nothing; kept for the release convention)
-- ARGV[3]  sharded flag (unused)
--
-- Reply    {1, 0} released; {0, 0} the lock is not held with this marker (lease ran out,
--          force-unlocked, or taken by someone else since)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1, 0}
end
return {0, 0}
