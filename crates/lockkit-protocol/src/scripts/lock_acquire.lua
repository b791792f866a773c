-- lock_acquire: take one hold of a reentrant lock.
--
-- KEYS[1]  lock key: a HASH. Field <owner> = that owner's hold count; field #<hold> (the hold
--          marker) = `<expiry> <owner>`, that one hold's own expiry in server ms and its owner
--          (see hold_lib.lua). The key expires with the latest live hold.
-- KEYS[2]  handoff key: a STRING, the owner of a multi-lock member (a looker) a release reserved
--          the free lock for; it expires after the handoff window (see handoff_lib.lua)
-- KEYS[3]  waiting key: a ZSET of the waiting requests (`<marker> <lease> <owner> <channel>`, see
--          handoff_lib.lua), scored by when they first found the lock taken (server clock,
--          microseconds): the order in which the lock is handed over
-- KEYS[4]  timeouts key: a ZSET, waiting request -> keep-alive deadline (server ms) by which its
--          call must run this script again, or be dropped from the waiting set
-- ARGV[1]  owner id (no spaces)
-- ARGV[2]  hold marker (#<client id>:<sequence>), the same for every try of one acquire call
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  keep-alive in ms: when the lock is taken, join the waiting set (or stay in it) until
--          now + keep-alive; 0 = do not wait: never join, and leave it if this request is in it
--          (`try_lock` with a zero wait, or the last try of a wait that ran out)
-- ARGV[5]  the calling client's own channel for this lock: a grant (or a looker's reservation)
--          is published there; optional with keep-alive 0 (the call joins nothing)
-- ARGV[6]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster; optional as ARGV[5]
-- ARGV[7]  optional; 1 = only look (a multi-lock waiting for all its members at once): where the
--          lock would be taken, reply {2} and take nothing (a reservation for this owner stays
--          until its window ends); where it is busy, join or stay in the waiting set as usual
--          (its request has lease 0: a release reserves the lock for it rather than granting)
--
-- Reply    {1, hold_count}     acquired; hold_count is the owner's count after this hold
--          {2}                 (only looking) it would have been acquired
--          {0, pttl, now}      held by another owner; pttl is what is left of its latest live
--                              hold (its own expiry, never -2), now the server clock (ms)
--          {0, window, now, 1} free but reserved for a looker: window is what is left of the
--                              handoff window
--
-- Every hold has its own lease: a re-entry with a shorter lease does not shorten the others',
-- and a hold whose lease ran out is gone even while the owner's other holds live on.
-- A call that finds the lock taken and will wait joins the waiting set (once: it keeps its first
-- place). It leaves it when a release grants it the lock (handoff_lib.lua: the lock is then held
-- by its marker, and this script, run again with that marker, reports the hold), when it takes the
-- lock itself, or when it gives up (lock_cancel.lua). A free lock with another owner's request at
-- the head of the waiting set (its holder's lease ran out, so no release handed it over) is
-- handed over to that request now, and the caller joins the set.
-- Idempotent per request: when the connection drops after the script ran, the client re-sends the
-- same request; the marker is already there, so the hold is not counted twice.
local key, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, marker, lease_arg, keepalive = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Both are optional for a call that never waits (keep-alive 0): it joins nothing.
local channel, sharded = ARGV[5] or '', ARGV[6] or '0'
local lease = tonumber(lease_arg)
local look = ARGV[7] == '1'

-- Free, nobody waiting, no handoff under way (the common case) was taken in front of the
-- libraries, in four commands (lock_acquire_free.lua): here one of the four keys exists.

local member = request(marker, look and 0 or lease_arg, owner, channel)
local now = now_ms()
local latest = settle(key, now, nil)

-- A re-sent request whose first run took the hold, or a grant not yet claimed: report it.
if latest and not look then
  local expiry = live_hold(key, marker, now)
  if expiry then
    leave_as_holder(waiting, timeouts, marker, lease_arg, owner, channel)
    return {1, take(key, owner, marker, math.max(expiry, now + lease), latest, true)}
  end
end

if not latest then
  local refused = turn_of_another(key, handoff, waiting, timeouts, owner, member, keepalive, look,
    sharded, now, nil)
  if refused then
    return refused
  end
  if look then
    return {2}
  end
  leave_as_holder(waiting, timeouts, marker, lease_arg, owner, channel)
  return {1, take(key, owner, marker, now + lease, nil, false)}
end

-- Re-entry by the same owner. A request of this call in the line (it waited, and its owner got
-- the lock meanwhile through another call) leaves it: a later release must not grant the lock to
-- a call that has returned.
if redis.call('HEXISTS', key, owner) == 1 then
  if look then
    return {2}
  end
  if redis.call('EXISTS', waiting) == 1 then
    leave_as_holder(waiting, timeouts, marker, lease_arg, owner, channel)
  end
  return {1, take(key, owner, marker, now + lease, latest, false)}
end

-- How long the holder can still hold it: its latest live hold's own expiry. (Not the key's PTTL: at a
-- millisecond boundary Redis's key-expiry clock may already have passed the expiry that TIME has
-- not, and PTTL would say -2 for a lock this script just found held.)
return wait_turn(waiting, timeouts, member, keepalive, latest - now, now)
