-- rwlock_status: the state of a read-write lock, as seen by one owner. Read-only in effect:
-- it only purges holds that have already expired.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries (see rwlock_acquire.lua)
-- ARGV[1]  owner id whose hold counts are reported
--
-- Reply    {mode, read_holds, write_holds, pttl}: mode 0 = free, 1 = read, 2 = write; the owner's
--          read and write hold counts; the lock key's PTTL (-2: free, -1: no expiry)
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

local key, expiries, owner = KEYS[1], KEYS[2], ARGV[1]
purge(key, expiries, now_ms())
local modes = {read = 1, write = 2}
local mode = redis.call('HGET', key, 'mode')
return {
  modes[mode] or 0,
  tonumber(redis.call('HGET', key, 'r:' .. owner) or 0),
  tonumber(redis.call('HGET', key, 'w:' .. owner) or 0),
  redis.call('PTTL', key),
}
