-- lock_release: give back one hold of a reentrant lock.
--
-- KEYS[1]  lock key (see lock_acquire.lua)
-- KEYS[2]  handoff key (see lock_acquire.lua)
-- KEYS[3]  waiting key (see lock_acquire.lua)
-- KEYS[4]  timeouts key (see lock_acquire.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  the lock's channel (not used: a grant goes to the waiting client's own channel)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, 0}           released; the lock is free, or was handed over to a waiting request
--          {2, hold_count}  released; the same owner still holds hold_count holds
--          {0, 0}           the hold was not there: its own lease ran out, the lock was
--                           force-unlocked, or this very hold was released already
--
-- The owner is read from the marker, so only the hold that was taken can be given back. Holds
-- whose lease ran out are ended first; the key then expires with the latest hold left, so it
-- shrinks when the longest hold is given back.
--
-- Handoff (handoff_lib.lua, hand_over): when the lock falls free with requests waiting, the
-- longest-waiting request whose client hears it is granted the lock in this very script, and one
-- message on that client's own channel tells it so; a multi-lock member that only looks is
-- reserved the free lock for the handoff window instead. No other client hears anything. With
-- nobody waiting, nothing is published.
local key, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, sharded = ARGV[1], ARGV[3]
-- KEYS[5] is absent (nil): a plain lock mints no tokens.
return release_hold(key, handoff, waiting, timeouts, marker, sharded, KEYS[5])
