-- fair_lock_force_unlock: delete a fair lock whoever holds it, and wake the waiter first in line.
-- Administrative. The queue is kept: waiters are served in order as before.
--
-- KEYS[1]  lock key, KEYS[2] queue key, KEYS[3] timeouts key (see fair_lock_acquire.lua)
-- ARGV[1]  channel on which the unlock is announced
-- ARGV[2]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    {1} the lock existed and was deleted; `w:<next waiter>` (or `one`) was published
--          {0} it was not locked
--
-- Stale waiters at the head (deadline passed) are dropped first.
local key, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local channel, sharded = ARGV[1], ARGV[2]

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local head = redis.call('LINDEX', queue, 0)
while head do
  local deadline = redis.call('ZSCORE', timeouts, head)
  if deadline and tonumber(deadline) > now then
    break
  end
  redis.call('LPOP', queue)
  redis.call('ZREM', timeouts, head)
  head = redis.call('LINDEX', queue, 0)
end

if redis.call('DEL', key) == 0 then
  return {0}
end
local message = 'one'
if head then
  message = 'w:' .. head
end
if sharded == '1' then
  redis.pcall('SPUBLISH', channel, message)
else
  redis.pcall('PUBLISH', channel, message)
end
return {1}
