-- rwlock_release: give back one hold (read or write) of a read-write lock.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries (see rwlock_acquire.lua)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  channel on which the release is announced
-- ARGV[3]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
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
-- rwlock common: begin (identical in every rwlock_*.lua; a unit test compares the copies)
-- The server's clock in milliseconds. Expiries are only ever compared with this clock.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Removes one hold: its marker, its expiry, one of its owner's counts. Returns the count field
-- it came from (nil: no such hold) and what is left in that field.
local function drop(key, expiries, marker)
  local field = redis.call('HGET', key, marker)
  if not field then
    return nil, 0
  end
  redis.call('HDEL', key, marker)
  redis.call('ZREM', expiries, marker)
  local left = redis.call('HINCRBY', key, field, -1)
  if left <= 0 then
    redis.call('HDEL', key, field)
  end
  return field, left
end

-- Makes the keys agree with the holds left: none → both keys deleted (returns false); the
-- writer's last write hold gone (`write_ended`) → read mode; both keys expire with the latest hold.
local function settle(key, expiries, write_ended)
  local latest = redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')
  if #latest == 0 then
    redis.call('DEL', key, expiries)
    return false
  end
  if write_ended then
    redis.call('HSET', key, 'mode', 'read')
  end
  redis.call('PEXPIREAT', key, latest[2])
  redis.call('PEXPIREAT', expiries, latest[2])
  return true
end

-- Drops every hold whose own expiry has come, then settles.
local function purge(key, expiries, now)
  local expired = redis.call('ZRANGEBYSCORE', expiries, '-inf', now)
  if #expired == 0 then
    return
  end
  local write_ended = false
  for _, marker in ipairs(expired) do
    local field, left = drop(key, expiries, marker)
    if field and string.sub(field, 1, 2) == 'w:' and left <= 0 then
      write_ended = true
    end
  end
  redis.call('ZREMRANGEBYSCORE', expiries, '-inf', now)
  settle(key, expiries, write_ended)
end
-- rwlock common: end

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
    redis.call('SPUBLISH', channel, wake)
  else
    redis.call('PUBLISH', channel, wake)
  end
end

local owner = string.sub(field, 3)
local held = tonumber(redis.call('HGET', key, 'r:' .. owner) or 0)
  + tonumber(redis.call('HGET', key, 'w:' .. owner) or 0)
if held > 0 then
  return {2, held}
end
return {1, 0}
