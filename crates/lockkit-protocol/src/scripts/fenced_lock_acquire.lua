-- fenced_lock_acquire: take one hold of a reentrant fenced lock and mint its fencing token.
--
-- KEYS[1]  lock key: a HASH laid out as a plain lock's (see lock_acquire.lua, hold_lib.lua), plus
--          one field <marker>:token per outstanding hold, holding that hold's token
-- KEYS[2]  token counter: a string integer that never expires
-- KEYS[3]  handoff key: the waiter a release reserved the free lock for (see lock_acquire.lua)
-- KEYS[4]  waiting key: the owners waiting, by when they first found it taken (see lock_acquire.lua)
-- KEYS[5]  timeouts key: the waiting owners' keep-alive deadlines (see lock_acquire.lua)
-- ARGV[1]  owner id (opaque)
-- ARGV[2]  hold marker, unique per acquire request
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  keep-alive in ms of a caller that waits when the lock is taken; 0 = try once (see
--          lock_acquire.lua)
-- ARGV[5]  channel on which the end of a reservation is announced (optional, see lock_acquire.lua)
-- ARGV[6]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    {1, hold_count, token}  acquired; every acquisition, re-entries included, gets a token
--                                  greater than every token minted before it
--          {0, pttl}               held by another owner (pttl: what is left of its latest live
--                                  hold)
--          {0, window, 1}          free but reserved for another waiter (window: what is left of
--                                  the handoff window), as in lock_acquire.lua
--
-- Tokens: every acquisition mints max(counter, server clock in microseconds) + 1. So a counter
-- that went back (Redis restarted from an older snapshot, or failed over to a replica that had
-- not seen the last increments) or was lost never hands out a token again, as long as the server
-- clock has not stepped back further than the counter did and fewer than a million acquisitions
-- happen per second on average.
-- Holds, leases, the waiting set and idempotence as in lock_acquire.lua: a re-sent request whose
-- first run took the hold returns that hold's token and counts nothing.
local key, counter, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, marker = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[3])
local token_field = marker .. ':token'

local now = now_ms()
local latest = settle(key, now, nil)

local expiry = live_hold(key, marker, now)
if expiry then
  local count = take(key, owner, marker, math.max(expiry, now + lease), latest, true)
  return {1, count, tonumber(redis.call('HGET', key, token_field))}
end

if not latest then
  -- Free: unless a release reserved it for another waiter, for the handoff window.
  if redis.call('EXISTS', handoff, waiting, timeouts) > 0 then
    local window = reserved_for_another(handoff, waiting, timeouts, owner, now, ARGV[5], ARGV[6])
    if window then
      return reserved_turn(waiting, timeouts, owner, ARGV[4], window, now)
    end
  end
elseif redis.call('HEXISTS', key, owner) == 0 then
  -- The latest live hold's own expiry, not the key's PTTL (see lock_acquire.lua).
  return wait_turn(waiting, timeouts, owner, ARGV[4], latest - now, now)
end

local time = redis.call('TIME')
local clock = tonumber(time[1]) * 1000000 + tonumber(time[2])
if tonumber(redis.call('GET', counter) or 0) < clock then
  redis.call('SET', counter, clock)
end
local token = redis.call('INCR', counter)
redis.call('HSET', key, token_field, token)
return {1, take(key, owner, marker, now + lease, latest, false), token}
