-- rwlock_release: give back one hold (read or write) of a read-write lock.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries (see rwlock_acquire.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  channel on which the release is announced
-- ARGV[3]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, 0}           released; the owner holds the lock no more (other readers may)
--          {2, hold_count}  released; the same owner still holds hold_count holds (read + write)
--          {0, 0}           the hold was not there: its lease ran out, the lock was force-unlocked,
--                           or this very hold was released already
--
-- Announcements: the end of a write phase (the writer's last write hold, whether or not its read
-- holds remain) publishes 'all', since every waiting reader may now enter; the end of a read phase
-- (the last hold of the lock) publishes 'one', since one writer may now enter. Nothing else can
-- admit a waiter. Expiries publish nothing: waiters are bounded by the wait_ms of their last try.

local key, expiries = KEYS[1], KEYS[2]
local marker, channel, sharded = ARGV[1], ARGV[2], ARGV[3]
purge(key, expiries, now_ms())

local field, left = drop(key, expiries, marker)
if not field then
  return {0, 0}
end
local write_ended = string.sub(field, 1, 2) == 'w:' and left <= 0
local wake = nil
if not settle(key, expiries, write_ended) then
  wake = write_ended and 'all' or 'one'
elseif write_ended then
  wake = 'all'
end
if wake then
  if sharded == '1' then
    redis.pcall('SPUBLISH', channel, wake)
  else
    redis.pcall('PUBLISH', channel, wake)
  end
end

local owner = string.sub(field, 3)
local held = tonumber(redis.call('HGET', key, 'r:' .. owner) or 0)
  + tonumber(redis.call('HGET', key, 'w:' .. owner) or 0)
if held > 0 then
  return {2, held}
end
return {1, 0}
