-- fenced_lock_acquire: take one hold of a reentrant fenced lock and mint its fencing token.
--
-- KEYS[1]  lock key: a HASH laid out as a plain lock's (see lock_acquire.lua, hold_lib.lua), plus
--          one field <marker>:token per outstanding hold, holding that hold's token
-- KEYS[2]  token counter: a string integer; it expires once the server clock has passed its value
--          by the counter TTL (ARGV[7]; see handoff_lib.lua, mint)
-- KEYS[3]  handoff key: the waiter a release reserved the free lock for (see lock_acquire.lua)
-- KEYS[4]  waiting key: the owners waiting, by when they first found it taken (see lock_acquire.lua)
-- KEYS[5]  timeouts key: the waiting owners' keep-alive deadlines (see lock_acquire.lua)
-- ARGV[1]  owner id (opaque)
-- ARGV[2]  hold marker, unique per acquire request
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  keep-alive in ms of a caller that waits when the lock is taken; 0 = try once (see
--          lock_acquire.lua)
-- ARGV[5]  the calling client's own channel for this lock (a grant is published there, see
--          lock_acquire.lua)
-- ARGV[6]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[7]  optional: the token counter's TTL in ms (1 ..= one year; absent or '': one day), given
--          to it again by every mint, this acquire's or a grant's
--
-- Reply    {1, hold_count, token}  acquired; every acquisition, re-entries included, gets a token
--                                  greater than every token minted before it
--          {0, pttl, now}          held by another owner (pttl: what is left of its latest live
--                                  hold; now: the server clock in ms), as in lock_acquire.lua
--          {0, window, now, 1}     free but reserved (not made by fenced locks' own waiters, which
--                                  never only look; as in lock_acquire.lua)
--
-- Tokens: every acquisition mints max(counter, server clock in microseconds) + 1. So a counter
-- that went back (Redis restarted from an older snapshot, or failed over to a replica that had
-- not seen the last increments), was lost or expired never hands out a token again, as long as
-- the server clock has not stepped back further than the counter did and fewer than a million
-- acquisitions happen per second on average. The counter expires only once the clock has passed
-- its value by the TTL, so its expiry needs no more than that (handoff_lib.lua, mint).
-- Holds, leases, the waiting set, direct grant and idempotence as in lock_acquire.lua: a re-sent
-- request whose first run took the hold, or a grant not yet claimed, returns that hold's token and
-- counts nothing. A grant (handoff_lib.lua, hand_over) mints its token as an acquire does.
local key, counter, handoff, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, marker, lease_arg, keepalive = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Both are optional for a call that never waits (keep-alive 0): it joins nothing.
local channel, sharded = ARGV[5] or '', ARGV[6] or '0'
local bad_ttl = use_counter_ttl(ARGV[7])
if bad_ttl then
  return bad_ttl
end
local lease = tonumber(lease_arg)
local token_field = marker .. ':token'
local member = request(marker, lease_arg, owner, channel)

local now = now_ms()
local latest = settle(key, now, nil)

-- A re-sent request whose first run took the hold, or a grant not yet claimed: report it.
local expiry = live_hold(key, marker, now)
if expiry then
  leave_as_holder(waiting, timeouts, marker, lease_arg, owner, channel)
  local count = take(key, owner, marker, math.max(expiry, now + lease), latest, true)
  return {1, count, tonumber(redis.call('HGET', key, token_field))}
end

if not latest then
  -- Free: unless it goes to another request first (a reservation, or another owner's request at
  -- the head of the waiting set, which is granted it now).
  if redis.call('EXISTS', handoff, waiting, timeouts) > 0 then
    local refused = turn_of_another(key, handoff, waiting, timeouts, owner, member, keepalive,
      false, sharded, now, counter)
    if refused then
      return refused
    end
    leave_as_holder(waiting, timeouts, marker, lease_arg, owner, channel)
  end
elseif redis.call('HEXISTS', key, owner) == 0 then
  -- The latest live hold's own expiry, not the key's PTTL (see lock_acquire.lua).
  return wait_turn(waiting, timeouts, member, keepalive, latest - now, now)
elseif redis.call('EXISTS', waiting) == 1 then
  -- A re-entry: a request of this call in the line leaves it (see lock_acquire.lua).
  leave_as_holder(waiting, timeouts, marker, lease_arg, owner, channel)
end

local token = mint(key, counter, marker)
return {1, take(key, owner, marker, now + lease, latest, false), token}
