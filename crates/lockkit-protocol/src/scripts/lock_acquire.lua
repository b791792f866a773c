-- lock_acquire: take one hold of a reentrant lock.
--
-- KEYS[1]  lock key: a HASH. Field <owner> = that owner's hold count; field #<hold> (the hold
--          marker) = `<expiry> <owner>`, that one hold's own expiry in server ms and its owner
--          (see hold_lib.lua). The key expires with the latest live hold.
-- KEYS[2]  handoff key: a STRING, the waiter a release reserved the free lock for; it expires
--          after the handoff window (see lock_release.lua)
-- KEYS[3]  waiting key: a ZSET of the owners that found the lock taken and wait, scored by when
--          they first did (server clock, microseconds); the order in which releases reserve it
-- KEYS[4]  timeouts key: a ZSET, waiting owner -> keep-alive deadline (server ms) by which it
--          must run this script again, or be dropped from the waiting set
-- ARGV[1]  owner id (opaque)
-- ARGV[2]  hold marker (#<client id>:<sequence>), unique per acquire request
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  keep-alive in ms: when the lock is taken, join the waiting set (or stay in it) until
--          now + keep-alive; 0 = try once, never join (`try_lock` with a zero wait)
-- ARGV[5]  channel on which the end of a reservation is announced (`taken`); optional: without
--          it, nothing is announced
-- ARGV[6]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
-- ARGV[7]  optional; 1 = only look (a multi-lock waiting for all its members at once): where the
--          lock would be taken, reply {2} and take nothing (a reservation for this owner stays
--          until its window ends); where it is busy, join or stay in the waiting set as usual
--
-- Reply    {1, hold_count}  acquired; hold_count is the owner's count after this hold
--          {2}              (only looking) it would have been acquired
--          {0, pttl}        held by another owner; pttl is what is left of its latest live hold
--                           (its own expiry, never -2)
--          {0, window, 1}   free but reserved for another waiter: window is what is left of the
--                           handoff window (the reserved owner's taking it is announced, `taken`)
--
-- Every hold has its own lease: a re-entry with a shorter lease does not shorten the others',
-- and a hold whose lease ran out is gone even while the owner's other holds live on.
-- An owner that finds the lock taken and will wait joins the waiting set (once: it keeps its first
-- place) and leaves it when it takes the lock, or gives up (lock_cancel.lua).
-- Idempotent per request: when the connection drops after the script ran, the client re-sends the
-- same request; the marker is already there, so the hold is not counted twice.
local key, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, marker = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[3])
local look = ARGV[7] == '1'

-- Free, nobody waiting, no handoff under way: the common case, in four commands.
if redis.call('EXISTS', key, handoff, waiting, timeouts) == 0 then
  if look then
    return {2}
  end
  local expiry = now_ms() + lease
  redis.call('HSET', key, owner, 1, marker, hold_value(expiry, owner))
  redis.call('PEXPIREAT', key, expiry)
  return {1, 1}
end

local now = now_ms()
local latest = settle(key, now, nil)

if not latest then
  -- Free. A release that woke waiters may have reserved it for the one waiting longest.
  if look then
    local window = reservation(handoff, timeouts, owner, now)
    if window then
      return reserved_turn(waiting, timeouts, owner, ARGV[4], window, now)
    end
    return {2}
  end
  local window = reserved_for_another(handoff, waiting, timeouts, owner, now, ARGV[5], ARGV[6])
  if window then
    return reserved_turn(waiting, timeouts, owner, ARGV[4], window, now)
  end
  return {1, take(key, owner, marker, now + lease, nil, false)}
end

-- Re-entry by the same owner, only looked at.
if look and redis.call('HEXISTS', key, owner) == 1 then
  return {2}
end

-- A re-sent request whose first run took the hold: report it, count nothing.
local expiry = live_hold(key, marker, now)
if expiry then
  return {1, take(key, owner, marker, math.max(expiry, now + lease), latest, true)}
end

-- Re-entry by the same owner.
if redis.call('HEXISTS', key, owner) == 1 then
  return {1, take(key, owner, marker, now + lease, latest, false)}
end

-- How long the holder can still hold it: its latest live hold's own expiry. (Not the key's PTTL: at a
-- millisecond boundary Redis's key-expiry clock may already have passed the expiry that TIME has
-- not, and PTTL would say -2 for a lock this script just found held.)
return wait_turn(waiting, timeouts, owner, ARGV[4], latest - now, now)
