-- fair_lock_force_unlock: delete a fair lock whoever holds it, and wake the waiter first in line.
-- Administrative. The queue is kept: waiters are served in order as before.
--
-- KEYS[1]  lock key, KEYS[2] queue key, KEYS[3] timeouts key (see fair_lock_acquire.lua)
-- ARGV[1]  the lock's channel (the next waiter is named on its client's, see fair_lib.lua)
-- ARGV[2]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} the lock existed and was deleted; `w:<next waiter>` was published on that
--              waiter's client's channel (fair_lib.lua; nothing when nobody is queued)
--          {0} it was not locked
--
-- Stale waiters at the head (deadline passed) are dropped first.
local key, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local channel, sharded = ARGV[1], ARGV[2]

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local head = drop_stale_heads(queue, timeouts, now, nil)

if redis.call('DEL', key) == 0 then
  return {0}
end
if head then
  name_next(channel, sharded, head)
end
return {1}
