-- fair_lock_release: give back one hold of a fair lock; when the lock is freed, wake the waiter
-- first in line, and only that one.
--
-- KEYS[1]  lock key, KEYS[2] queue key, KEYS[3] timeouts key (see fair_lock_acquire.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  the lock's channel (the next waiter is named on its client's, see fair_lib.lua)
-- ARGV[3]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, 0}           released; the lock is now free, and `w:<id of the next waiter>` was
--                           published on that waiter's client's channel (fair_lib.lua; nothing
--                           when nobody is queued)
--          {2, hold_count}  released; the same owner still holds hold_count holds
--          {0, 0}           the hold was not there: its own lease ran out, the lock was
--                           force-unlocked, or this very hold was released already
--
-- Stale waiters at the head (deadline passed) are dropped first, so the message names a live one.
-- The owner is read from the marker, so only the hold that was taken can be given back. Holds
-- whose own lease ran out are ended first (hold_lib.lua); the key then expires with the latest
-- hold left, so it shrinks when the longest hold is given back.
local key, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local marker, channel, sharded = ARGV[1], ARGV[2], ARGV[3]

local now = now_ms()
local head = drop_stale_heads(queue, timeouts, now, nil)

local held = give_back(key, now, marker)
if held then
  return held
end
if head then
  name_next(channel, sharded, head)
end
return {1, 0}
