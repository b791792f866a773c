-- semaphore_acquire: take k permits of a semaphore as one hold (both semaphore kinds).
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- ARGV[1]  hold marker (#<client id>:<sequence>), unique per acquire request
-- ARGV[2]  permits to take, k > 0
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  channel on which permits that came back are announced
-- ARGV[5]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[6]  the handle's configured total, '' when it has none: when the total is absent (never
--          set, or lost with the data: an empty restart, FLUSHALL, eviction, a failover to a
--          lagging replica), it is set to this first, atomically, and every waiter is told
--          ('all'); the first initialiser wins, as with semaphore_try_set_permits
--
-- Reply    {1, available}  acquired; available = the permits still free afterwards
--          {0, wait}       too few permits are free; wait = ms until the earliest lease of a
--                          holder ends (a retry is worthwhile by then even if no release is
--                          announced), -1 when unknown
--          {2, total}      refused: k is more than the total, it would never be granted
--          {3, 0}          refused: the semaphore's permits were never set (and no configured
--                          total was given)
--
-- Idempotent per request: a request re-sent after its first run took the permits finds its
-- marker, takes nothing more and reports success. The lease is never shortened.
local main, leases = KEYS[1], KEYS[2]
local marker, k, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local channel, sharded = ARGV[4], ARGV[5]

local now = now_ms()
local returned = purge(main, leases, now)
local reply
local total = tonumber(redis.call('HGET', main, 'permits'))
local initialised = false
if total == nil then
  total = configured_total(ARGV[6])
  if total ~= nil then
    redis.call('HSET', main, 'permits', total)
    initialised = true
  end
end
if total == nil then
  reply = {3, 0}
else
  local score = redis.call('ZSCORE', leases, marker)
  if score then
    if tonumber(score) < now + lease then
      redis.call('ZADD', leases, now + lease, marker)
    end
    reply = {1, available(main)}
  elseif k > total then
    reply = {2, total}
  elseif available(main) >= k then
    redis.call('HSET', main, marker, ARGV[2])
    redis.call('HINCRBY', main, 'used', ARGV[2])
    redis.call('ZADD', leases, now + lease, marker)
    reply = {1, available(main)}
  else
    local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
    if first[2] then
      reply = {0, math.max(tonumber(first[2]) - now, 0)}
    else
      reply = {0, -1}
    end
  end
end
if initialised then
  announce_total_changed(channel, sharded)
else
  announce(main, returned, channel, sharded)
end
return reply
