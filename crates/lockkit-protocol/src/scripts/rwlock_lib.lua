-- rwlock_lib: helpers put in front of every rwlock_*.lua script at compile time, after line_lib.lua
-- (see read_write_lock.rs): the server clock, dropping a hold, settling the keys, purging, and
-- granting the line.
--
-- The line (line_lib.lua): KEYS[3] waiting, KEYS[4] timeouts; a request is
-- `<marker> <lease ms> <r|w>:<owner> <channel>`. It is FIFO (task-fair, as tokio's RwLock): a
-- call that is not a re-entry takes the lock only when nobody waits ahead of it, so a writer
-- waiting holds back the readers that come after it, and readers never starve a writer.
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

-- Grants the line (line_lib.lua, serve_line) from its head while the head fits: a writer fits a
-- free lock, a reader a lock that no writer holds, so a writer's release grants the head writer,
-- or every reader at the head up to the next writer, and the last hold's release grants the head
-- writer. A grant is a hold on probation (expiry now + min(lease, PROBATION_MS)), told on the
-- request's channel with its owner's count in that mode, one message per client however many of
-- its calls were granted (line_lib.lua, grant_line_told); one nobody heard is undone. The
-- walk stops at a head that does not fit (nothing behind it overtakes it) and at the request of
-- `caller` (a marker: the acquire running this serves itself).
local function grant_line(key, expiries, waiting, timeouts, sharded, now, caller)
  grant_line_told(waiting, timeouts, now, sharded, function(marker, lease, ask, channel)
    if marker == caller then
      return 'stop'
    end
    local want, owner = string.match(ask, '^([rw]):(.+)$')
    if not want or redis.call('HEXISTS', key, marker) == 1 then
      return 'next'
    end
    local mode = redis.call('HGET', key, 'mode')
    if mode == 'write' or (want == 'w' and mode) then
      return 'stop'
    end
    local field = want .. ':' .. owner
    local expiry = now + math.min(lease, PROBATION_MS)
    local count = redis.call('HINCRBY', key, field, 1)
    redis.call('HSET', key, marker, field)
    if not mode then
      redis.call('HSET', key, 'mode', want == 'w' and 'write' or 'read')
    end
    redis.call('ZADD', expiries, expiry, marker)
    settle(key, expiries, false)
    return 'next', grant_message(count, 0, now, expiry, marker), function()
      local _, left = drop(key, expiries, marker)
      settle(key, expiries, want == 'w' and left <= 0)
    end
  end)
end
