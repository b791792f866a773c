-- rwlock_lib: helpers put in front of every rwlock_*.lua script at compile time
-- (see read_write_lock.rs): the server clock, dropping a hold, settling the keys, purging.
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
