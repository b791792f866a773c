-- rwlock_renew: extend (or only check) many read-write lock holds in one round trip. Used by the
-- watchdog.
--
-- KEYS[2i-1]   lock key of the i-th hold (see rwlock_acquire.lua)
-- KEYS[2i]     expiries of the i-th hold (all keys in one cluster slot when clustered)
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to; 0 = only check that the hold is still there
--
-- Reply        array with one integer per hold: 1 = the hold is there (and was extended),
--              0 = the hold is gone (its own lease ran out, force-unlocked, lost by Redis, or a
--              key overwritten with another type: one bad key must not fail the whole batch)
--
-- Only the named hold's own expiry moves: a reader's renewal never keeps another reader's hold
-- alive. Expired holds are purged first, so an expired hold is never revived; a released hold
-- has no marker left to find. Expiries are never shortened.
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

local now = now_ms()
local result = {}
for i = 1, #ARGV / 2 do
  local key, expiries = KEYS[2 * i - 1], KEYS[2 * i]
  local marker, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  result[i] = 0
  if redis.call('TYPE', key)['ok'] == 'hash' and redis.call('TYPE', expiries)['ok'] == 'zset' then
    purge(key, expiries, now)
    local expiry = redis.call('ZSCORE', expiries, marker)
    if expiry and redis.call('HEXISTS', key, marker) == 1 then
      if lease > 0 and tonumber(expiry) < now + lease then
        redis.call('ZADD', expiries, now + lease, marker)
        settle(key, expiries, false)
      end
      result[i] = 1
    end
  end
end
return result
