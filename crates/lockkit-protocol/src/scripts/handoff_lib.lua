-- handoff_lib: helpers put in front of lock_acquire, lock_release, fenced_lock_acquire and
-- fenced_lock_release at compile time (see lock.rs): the waiting set (`waiting`, a ZSET owner ->
-- when it first found the lock taken, server microseconds) and the handoff reservation (`handoff`,
-- a STRING naming the owner a release reserved the free lock for, expiring after the window).
-- The handoff window in ms (lockkit_protocol::lock::HANDOFF_WINDOW).
local HANDOFF_WINDOW_MS = 10

-- Reports the lock busy for `pttl`; first, if the caller will wait (`will_wait` = '1'), it joins
-- the waiting set, keeping an earlier place.
local function wait_turn(waiting, owner, will_wait, pttl)
  if will_wait == '1' and not redis.call('ZSCORE', waiting, owner) then
    local now = redis.call('TIME')
    redis.call('ZADD', waiting, tonumber(now[1]) * 1000000 + tonumber(now[2]), owner)
    redis.call('PEXPIRE', waiting, math.max(60000, 2 * pttl))
  end
  return {0, pttl}
end

-- For a free lock: the rest of the window (ms) if a release reserved it for another owner; else
-- nil, after ending a reservation for `owner` and taking it out of the waiting set (it is about
-- to take the lock).
local function reserved_for_another(handoff, waiting, owner)
  local reserved = redis.call('GET', handoff)
  if reserved and reserved ~= owner then
    return redis.call('PTTL', handoff)
  end
  if reserved then
    redis.call('DEL', handoff)
  end
  redis.call('ZREM', waiting, owner)
  return nil
end

-- After the last hold was given back: announces the release on `channel` (SPUBLISH when
-- `sharded` = '1'). The message names the owner that has waited longest (`p:<owner>`), so its
-- client wakes that very waiter (every other client wakes one waiter too, which is refused and
-- waits again: the lock is never stranded when the named owner's client is gone); `one` when
-- nobody is in the set. When a subscriber got it, the free lock is reserved for that owner for
-- the window; the owner leaves the set either way.
local function announce_release(handoff, waiting, channel, sharded)
  local first = redis.call('ZRANGE', waiting, 0, 0)[1]
  local message = 'one'
  if first then
    message = 'p:' .. first
  end
  local woken
  if sharded == '1' then
    woken = redis.pcall('SPUBLISH', channel, message)
  else
    woken = redis.pcall('PUBLISH', channel, message)
  end
  if first then
    redis.call('ZREM', waiting, first)
    if type(woken) == 'number' and woken > 0 then
      redis.call('SET', handoff, first, 'PX', HANDOFF_WINDOW_MS)
    end
  end
end

