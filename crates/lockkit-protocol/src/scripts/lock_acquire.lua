-- lock_acquire: take one hold of a reentrant lock.
--
-- KEYS[1]  lock key: a HASH. Field <owner> = that owner's hold count; field #<hold> = owner of one
--          outstanding hold (the hold marker). The key's TTL is the lease.
-- KEYS[2]  handoff key: a STRING, the waiter a release reserved the free lock for; it expires
--          after the handoff window (see lock_release.lua)
-- KEYS[3]  waiting key: a ZSET of the owners that found the lock taken, scored by when they first
--          did (server clock, microseconds); the order in which releases reserve the lock
-- ARGV[1]  owner id   (<client id>:<task>)
-- ARGV[2]  hold marker (#<client id>:<sequence>), unique per acquire request
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  1 if the caller waits when the lock is taken (it then joins the waiting set), else 0
--
-- Reply    {1, hold_count}  acquired; hold_count is the owner's count after this hold
--          {0, pttl}        held by another owner; pttl is the key's remaining TTL in ms
--                           (-1 when the key has no expiry); or free but reserved for another
--                           waiter: pttl is what is left of the handoff window
--
-- An owner that finds the lock taken and will wait joins the waiting set (once: it keeps its first
-- place) and leaves it when it takes the lock.
-- Idempotent per request: when the connection drops after the script ran, the client re-sends the
-- same request; the marker is already there, so the hold is not counted twice.
-- The TTL is never shortened: a re-entry with a shorter lease keeps the longer one.
local key, handoff, waiting = KEYS[1], KEYS[2], KEYS[3]
local owner, marker = ARGV[1], ARGV[2]

-- Free, nobody waiting, no handoff under way: the common case, in three commands.
if redis.call('EXISTS', key, handoff, waiting) == 0 then
  redis.call('HSET', key, owner, 1, marker, owner)
  redis.call('PEXPIRE', key, ARGV[3])
  return {1, 1}
end

local lease = tonumber(ARGV[3])

if redis.call('EXISTS', key) == 0 then
  -- Free. A release that woke waiters reserved it for the one waiting longest, for the window.
  local window = reserved_for_another(handoff, waiting, owner)
  if window then
    return wait_turn(waiting, owner, ARGV[4], window)
  end
  redis.call('HSET', key, owner, 1, marker, owner)
  redis.call('PEXPIRE', key, lease)
  return {1, 1}
end

-- A re-sent request whose first run took the hold: report it, count nothing.
if redis.call('HEXISTS', key, marker) == 1 then
  if redis.call('PTTL', key) < lease then
    redis.call('PEXPIRE', key, lease)
  end
  return {1, tonumber(redis.call('HGET', key, owner) or 0)}
end

-- Re-entry by the same owner.
if redis.call('HEXISTS', key, owner) == 1 then
  local count = redis.call('HINCRBY', key, owner, 1)
  redis.call('HSET', key, marker, owner)
  if redis.call('PTTL', key) < lease then
    redis.call('PEXPIRE', key, lease)
  end
  return {1, count}
end

return wait_turn(waiting, owner, ARGV[4], redis.call('PTTL', key))
