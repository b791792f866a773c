-- semaphore_lib: helpers shared by every semaphore script (both kinds); the runtime prepends this
-- file to each semaphore_*.lua, so the helpers are written once.
--
-- Data of one semaphore:
-- KEYS[1]  main HASH: field `permits` = the total number of permits (absent: never set, or lost
--          with the data: an acquire or add_permits given a configured total sets it again);
--          field `used` = the permits held by live holds; field #<hold> (a hold marker, always
--          starting with '#') = the number of permits that hold took; field `evicted` = how many
--          times a script found one of the two keys evicted and repaired it (absent: never)
-- KEYS[2]  leases ZSET: member = hold marker, score = end of that hold's lease, in server
--          milliseconds (redis.call('TIME'), never a client clock)
--
-- A hold is live while its score is in the future. Every script first gives back the permits of
-- the holds whose lease has ended (`purge`), so a crashed holder's permits come back without
-- anyone releasing them; the permits that came back are announced.

-- The server's time in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Takes `n` permits off `used`; never below zero.
local function give_back(main, n)
  if n > 0 and redis.call('HINCRBY', main, 'used', -n) < 0 then
    redis.call('HSET', main, 'used', 0)
  end
end

-- Notices that Redis evicted one of the two keys (neither has a TTL, so a maxmemory policy
-- `allkeys-*` may evict either: see docs/topologies.md) and repairs what can be repaired; returns
-- the permits that came back. Cheap in the normal case: two HGETs, plus one TYPE while permits
-- are in use. Uses only commands of the minimal ACL (docs/security.md).
-- - The leases ZSET is gone while `used` counts permits: no hold could ever end, and those
--   permits would be lost for good. Every hold is dropped (its holder's renewal or release finds
--   it gone, so the guard reports the loss) and its permits come back: the main HASH is
--   rewritten with the total alone.
-- - The total (`permits`) is gone while the leases ZSET remains: the main HASH was evicted, with
--   the permits each hold took. The holds are dropped (as above); the total must be set again.
-- Each repair adds 1 to the main HASH's `evicted` field, which Client::inspect reports.
local function repair_eviction(main, leases)
  local total = redis.call('HGET', main, 'permits')
  if total then
    local used = tonumber(redis.call('HGET', main, 'used')) or 0
    if used <= 0 or redis.call('TYPE', leases)['ok'] ~= 'none' then
      return 0
    end
    local evicted = tonumber(redis.call('HGET', main, 'evicted')) or 0
    redis.call('DEL', main)
    redis.call('HSET', main, 'permits', total, 'used', 0, 'evicted', evicted + 1)
    return used
  end
  if redis.call('TYPE', leases)['ok'] == 'zset' then
    redis.call('DEL', leases)
    redis.call('HINCRBY', main, 'evicted', 1)
  end
  return 0
end

-- Gives back the permits of every hold whose lease ended by `now` (and of every hold an eviction
-- orphaned, see `repair_eviction`); returns how many came back.
local function purge(main, leases, now)
  local repaired = repair_eviction(main, leases)
  local ended = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  if #ended == 0 then
    return repaired
  end
  local back = 0
  for _, marker in ipairs(ended) do
    back = back + (tonumber(redis.call('HGET', main, marker)) or 0)
    redis.call('HDEL', main, marker)
  end
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
  give_back(main, back)
  return repaired + back
end

-- The permits free now (0 while holders keep more than a reduced total).
local function available(main)
  local total = tonumber(redis.call('HGET', main, 'permits')) or 0
  local used = tonumber(redis.call('HGET', main, 'used')) or 0
  return math.max(total - used, 0)
end

-- Publishes `payload` on the semaphore's channel (SPUBLISH when `sharded` is '1').
local function publish(channel, sharded, payload)
  if sharded == '1' then
    redis.pcall('SPUBLISH', channel, payload)
  else
    redis.pcall('PUBLISH', channel, payload)
  end
end

-- Announces that `returned` permits came back: 'n:<k>' wakes k waiters, k = the permits that
-- came back, or fewer when fewer are free (a total reduced below what holders keep). Nothing
-- when none are free.
local function announce(main, returned, channel, sharded)
  if returned <= 0 then
    return
  end
  local k = math.min(returned, available(main))
  if k <= 0 then
    return
  end
  publish(channel, sharded, 'n:' .. k)
end

-- Announces that the total was set (it was absent) or lowered: 'all' makes every waiter try
-- once more, so a waiter whose request the new total made impossible is refused at once (and one
-- that can now be served is), instead of sleeping until a holder's lease ends. Replaces the
-- 'n:<k>' announcement of the same script run: every waiter tries anyway.
local function announce_total_changed(channel, sharded)
  publish(channel, sharded, 'all')
end

-- The total given by a script argument (a handle's configured total), or nil: an absent argument,
-- '' (unknown) and anything that is not a whole number in 0..4294967295 count as unknown.
local function configured_total(arg)
  if arg == nil then
    return nil
  end
  local total = tonumber(arg)
  if total == nil or total < 0 or total > 4294967295 or total ~= math.floor(total) then
    return nil
  end
  return total
end

