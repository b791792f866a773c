-- handoff_lib: the waiting set and the handoff reservation of the lock and the fenced lock, put in
-- front of their acquire, release and cancel scripts at compile time (see lock.rs):
--   waiting   a ZSET owner -> when it first found the lock taken (server microseconds): the order
--   timeouts  a ZSET owner -> its keep-alive deadline (server ms), pushed on by every retry; an
--             owner whose deadline passed stopped waiting (gave up unseen, or its client died)
--   handoff   a STRING naming the owner a release reserved the free lock for, expiring after the
--             handoff window
-- An owner waits while it has a deadline in the future. Every owner in `waiting` has a deadline;
-- a reserved owner keeps its deadline (not its place in `waiting`) until it takes the lock or
-- gives up. Needs hold_lib.lua's now_ms in front.
-- The handoff window in ms (lockkit_protocol::lock::HANDOFF_WINDOW).
local HANDOFF_WINDOW_MS = 10

-- Makes `k` live at least `ms` more milliseconds.
local function extend(k, ms)
  if redis.call('PTTL', k) < ms then
    redis.call('PEXPIRE', k, ms)
  end
end

-- Takes `owner` out of the waiting set (it takes the lock, or stopped waiting).
local function leave_waiting(waiting, timeouts, owner)
  redis.call('ZREM', waiting, owner)
  redis.call('ZREM', timeouts, owner)
end

-- Drops every waiter whose keep-alive deadline passed by `now`.
local function prune(waiting, timeouts, now)
  local stale = redis.call('ZRANGEBYSCORE', timeouts, '-inf', now)
  for _, owner in ipairs(stale) do
    redis.call('ZREM', waiting, owner)
  end
  if #stale > 0 then
    redis.call('ZREMRANGEBYSCORE', timeouts, '-inf', now)
  end
end

-- Reports the lock busy for `pttl`; first, if the caller will wait (`keepalive` ms > 0), it joins
-- the waiting set, keeping an earlier place, and its deadline moves to now + keepalive.
local function wait_turn(waiting, timeouts, owner, keepalive, pttl, now)
  keepalive = tonumber(keepalive)
  if keepalive > 0 then
    if not redis.call('ZSCORE', waiting, owner) then
      local time = redis.call('TIME')
      redis.call('ZADD', waiting, tonumber(time[1]) * 1000000 + tonumber(time[2]), owner)
    end
    redis.call('ZADD', timeouts, now + keepalive, owner)
    extend(waiting, keepalive)
    extend(timeouts, keepalive)
  end
  return {0, pttl}
end

-- Reports the free lock reserved for another owner for `window` more ms ({0, window, 1}); the
-- caller joins the waiting set as in wait_turn.
local function reserved_turn(waiting, timeouts, owner, keepalive, window, now)
  local busy = wait_turn(waiting, timeouts, owner, keepalive, window, now)
  busy[3] = 1
  return busy
end

-- Publishes `message` on `channel` (SPUBLISH when `sharded` = '1'); the number of subscribers
-- that got it, or an error reply (pcall: a failed announcement must not undo the script's work).
local function publish(channel, sharded, message)
  if sharded == '1' then
    return redis.pcall('SPUBLISH', channel, message)
  end
  return redis.pcall('PUBLISH', channel, message)
end

-- For a free lock: the rest of the window (ms) if a release reserved it for another owner that
-- still waits, else nil; and the owner it was reserved for, if any. Changes nothing.
local function reservation(handoff, timeouts, owner, now)
  local reserved = redis.call('GET', handoff)
  if reserved and reserved ~= owner then
    local deadline = redis.call('ZSCORE', timeouts, reserved)
    if deadline and tonumber(deadline) > now then
      return redis.call('PTTL', handoff), reserved
    end
  end
  return nil, reserved
end

-- For a free lock: the rest of the window (ms) if a release reserved it for another owner that
-- still waits; else nil, after ending a reservation (for `owner`, or for an owner that stopped
-- waiting) and taking `owner` out of the waiting set (it is about to take the lock). Ending a
-- reservation is announced (`taken`) on `channel` when one is given: the clients that were told
-- of it (`p:<owner>`) and armed a wake-up for the end of the window need not try.
local function reserved_for_another(handoff, waiting, timeouts, owner, now, channel, sharded)
  local window, reserved = reservation(handoff, timeouts, owner, now)
  if window then
    return window
  end
  if reserved then
    redis.call('DEL', handoff)
    if channel then
      publish(channel, sharded, 'taken')
    end
  end
  leave_waiting(waiting, timeouts, owner)
  return nil
end

-- When the lock is free and no reservation stands: announces it on `channel` (SPUBLISH when
-- `sharded` = '1'), unless nobody waits (every waiter is in the waiting set: it joined in the
-- try that found the lock taken, and leaves only when it takes the lock or stops waiting).
-- Waiters whose deadline passed are dropped first. The message names the owner that has waited
-- longest (`p:<owner>`): its client wakes that very waiter; every other client wakes one waiter
-- only if the window passes without `taken` (reserved_for_another), so the lock is never
-- stranded when the named owner's client is gone; `one` when only stale waiters were left. When a
-- subscriber got it, the free lock is reserved for that owner for the window; the owner leaves
-- the set either way.
local function announce_release(handoff, waiting, timeouts, channel, sharded, now)
  if redis.call('EXISTS', waiting) == 0 then
    return
  end
  prune(waiting, timeouts, now)
  local first = redis.call('ZRANGE', waiting, 0, 0)[1]
  local message = 'one'
  if first then
    message = 'p:' .. first
  end
  local woken = publish(channel, sharded, message)
  if first then
    redis.call('ZREM', waiting, first)
    if type(woken) == 'number' and woken > 0 then
      redis.call('SET', handoff, first, 'PX', HANDOFF_WINDOW_MS)
    end
  end
end

-- Gives back the hold `marker` (lock_release.lua and fenced_lock_release.lua): ends it and every
-- hold whose lease ran out; the key then expires with the latest hold left. When none is left,
-- announces the release (announce_release). Returns the release script's reply.
local function release_hold(key, handoff, waiting, timeouts, marker, channel, sharded)
  local now = now_ms()
  local held = give_back(key, now, marker)
  if held then
    return held
  end
  announce_release(handoff, waiting, timeouts, channel, sharded, now)
  return {1, 0}
end
