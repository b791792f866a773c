-- fair_lock_cancel: take a waiter that stopped waiting (timed out, or its acquire future was
-- dropped) out of a fair lock's queue, and pass its turn on.
--
-- KEYS[1]  lock key, KEYS[2] queue key, KEYS[3] timeouts key (see fair_lock_acquire.lua)
-- ARGV[1]  waiter id to remove
-- ARGV[2]  the lock's channel (the next waiter is named on its client's, see fair_lib.lua)
-- ARGV[3]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} the waiter was queued and is removed; {0} it was not queued (already granted,
--          dropped as stale, or never queued)
--
-- Stale waiters at the head (deadline passed) are dropped too. When the lock is free and this
-- changed who is first in line, the new head is named on the channel: it may have been waiting
-- behind the removed waiter with nobody left to tell it its turn came. Idempotent: a second run
-- finds nothing to remove.
local key, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local waiter, channel, sharded = ARGV[1], ARGV[2], ARGV[3]

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local before = redis.call('LINDEX', queue, 0)

local removed = 0
if redis.call('ZREM', timeouts, waiter) == 1 then
  redis.call('LREM', queue, 1, waiter)
  removed = 1
end

local head = drop_stale_heads(queue, timeouts, now, nil)
if head and head ~= before and redis.call('EXISTS', key) == 0 then
  name_next(channel, sharded, head)
end
return {removed}
