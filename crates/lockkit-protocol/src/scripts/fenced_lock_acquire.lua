-- fenced_lock_acquire: take one hold of a reentrant fenced lock and mint its fencing token.
--
-- KEYS[1]  lock key: a HASH laid out as a plain lock's (see lock_acquire.lua), plus one field
--          <marker>:token per outstanding hold, holding that hold's token
-- KEYS[2]  token counter: a string integer that never expires and only grows
-- KEYS[3]  handoff key: the waiter a release reserved the free lock for (see lock_acquire.lua)
-- KEYS[4]  waiting key: the owners waiting, by when they first found it taken (see lock_acquire.lua)
-- ARGV[1]  owner id
-- ARGV[2]  hold marker, unique per acquire request
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  1 if the caller waits when the lock is taken (it then joins the waiting set), else 0
--
-- Reply    {1, hold_count, token}  acquired; every acquisition, re-entries included, gets a token
--                                  greater than every token minted before it
--          {0, pttl}               held by another owner (pttl -1: the key has no expiry); or
--                                  free but reserved for another waiter (pttl: what is left of
--                                  the handoff window), as in lock_acquire.lua
--
-- A counter that does not exist yet (first use, or a Redis that lost its data) starts from the
-- server clock in microseconds, so tokens keep growing across such a loss as long as the clock
-- does and fewer than a million acquisitions happen per second.
-- Idempotent per request: a re-sent request whose first run took the hold returns that hold's
-- token and counts nothing.
local key, counter, handoff, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, marker = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[3])
local token_field = marker .. ':token'

if redis.call('HEXISTS', key, marker) == 1 then
  if redis.call('PTTL', key) < lease then
    redis.call('PEXPIRE', key, lease)
  end
  return {1, tonumber(redis.call('HGET', key, owner) or 0), tonumber(redis.call('HGET', key, token_field))}
end

local count
if redis.call('EXISTS', key) == 0 then
  -- Free: unless a release reserved it for another waiter, for the handoff window.
  if redis.call('EXISTS', handoff, waiting) > 0 then
    local window = reserved_for_another(handoff, waiting, owner)
    if window then
      return wait_turn(waiting, owner, ARGV[4], window)
    end
  end
  count = 1
  redis.call('HSET', key, owner, 1)
elseif redis.call('HEXISTS', key, owner) == 1 then
  count = redis.call('HINCRBY', key, owner, 1)
else
  return wait_turn(waiting, owner, ARGV[4], redis.call('PTTL', key))
end

if redis.call('EXISTS', counter) == 0 then
  local now = redis.call('TIME')
  redis.call('SET', counter, tonumber(now[1]) * 1000000 + tonumber(now[2]))
end
local token = redis.call('INCR', counter)
redis.call('HSET', key, marker, owner, token_field, token)
if redis.call('PTTL', key) < lease then
  redis.call('PEXPIRE', key, lease)
end
return {1, count, token}
