-- semaphore_lib: helpers shared by every semaphore script (both kinds); the runtime prepends
-- line_lib.lua and this file to each semaphore_*.lua, so the helpers are written once.
--
-- Data of one semaphore:
-- KEYS[1]  main HASH: field `permits` = the total number of permits (absent: never set, or lost
--          with the data: an acquire or add_permits given a configured total sets it again);
--          field `used` = the permits held by live holds; field #<hold> (a hold marker, always
--          starting with '#') = the number of permits that hold took; field `evicted` = how many
--          times a script found one of the two keys evicted and repaired it (absent: never)
-- KEYS[2]  leases ZSET: member = hold marker, score = end of that hold's lease, in server
--          milliseconds (redis.call('TIME'), never a client clock)
-- KEYS[3]  waiting ZSET, KEYS[4] timeouts ZSET: the line of waiting acquire calls (line_lib.lua);
--          a request's ask is its number of permits. Both expire with the last keep-alive.
--
-- A hold is live while its score is in the future. Every script first gives back the permits of
-- the holds whose lease has ended (`purge`), so a crashed holder's permits come back without
-- anyone releasing them.
--
-- The line is FIFO: whatever frees permits (a release, a lease found run out, permits added, a
-- total set) grants them to the head of the line while the head's request fits (`grant_line`),
-- one message per granted call on its client's own channel, nothing to anyone else. A request for
-- many permits at the head is not overtaken by smaller ones behind it (tokio's Semaphore makes
-- the same choice: no starvation of acquire_many); an acquire finds permits free only when nobody
-- waits ahead of it. A request that a total change made impossible (it asks for more than the
-- total) leaves the line and its waiter is woken ('w:<marker>') to be refused (`refuse_impossible`).
-- A client several of whose calls are granted at once is told once (line_lib.lua, grant_line_told).

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

-- Ends the hold `marker` now: its permits come back. Returns them (0: it was not there).
local function end_hold(main, leases, marker)
  local k = tonumber(redis.call('HGET', main, marker)) or 0
  redis.call('HDEL', main, marker)
  redis.call('ZREM', leases, marker)
  give_back(main, k)
  return k
end

-- Grants free permits to the line (line_lib.lua, serve_line) while its head's request fits: the
-- head becomes a hold of its permits on probation (expiry now + min(lease, PROBATION_MS)) and is
-- told on its channel; a grant nobody heard is undone at once. The walk stops at a head that asks
-- for more than is free (it is not overtaken), at the request of `caller` (a marker: the acquire
-- running this serves itself), or while the total is absent. A head asking for more than the
-- total is dropped (refuse_impossible tells it).
local function grant_line(main, leases, waiting, timeouts, sharded, now, caller)
  grant_line_told(waiting, timeouts, now, sharded, function(marker, lease, ask, channel)
    local k = tonumber(ask)
    local total = tonumber(redis.call('HGET', main, 'permits'))
    if marker == caller or total == nil then
      return 'stop'
    end
    if k == nil or k < 1 or k > total or redis.call('ZSCORE', leases, marker) then
      return 'next'
    end
    if available(main) < k then
      return 'stop'
    end
    local expiry = now + math.min(lease, PROBATION_MS)
    redis.call('HSET', main, marker, k)
    redis.call('HINCRBY', main, 'used', k)
    redis.call('ZADD', leases, expiry, marker)
    return 'next', grant_message(k, 0, now, expiry, marker), function()
      end_hold(main, leases, marker)
    end
  end)
end

-- After the total was set or lowered: every live request in the line that asks for more than the
-- total leaves it, and its waiter is woken ('w:<marker>' on its channel) to try once more and be
-- refused at once, not when its keep-alive runs out.
local function refuse_impossible(main, waiting, timeouts, sharded, now)
  local total = tonumber(redis.call('HGET', main, 'permits'))
  if total == nil or redis.call('EXISTS', waiting) == 0 then
    return
  end
  prune(waiting, timeouts, now)
  for _, member in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
    local marker, _, ask, channel = parse_request(member)
    if not marker or (tonumber(ask) or 0) > total then
      leave_waiting(waiting, timeouts, member)
      if marker then
        heard(channel, sharded, 'w:' .. marker)
      end
    end
  end
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

