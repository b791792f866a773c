-- handoff_lib: the lock's and fenced lock's use of the line (line_lib.lua), put in front of their
-- acquire, release, cancel and force-unlock scripts at compile time (see lock.rs), with one more key:
--   handoff   a STRING naming the owner a release reserved the free lock for (a multi-lock member
--             that only looks, see below), expiring after the handoff window
-- A request's ask (line_lib.lua) is its owner; its lease is 0 for a multi-lock member that only
-- looks and takes nothing.
--
-- Direct grant: when the lock falls free with requests waiting, the script that freed it makes the
-- longest-waiting request the holder (its marker, its lease) and publishes the grant on that
-- request's channel, to that one client (line_lib.lua, serve_line: the lock fits one request, so
-- the walk ends at the first grant heard). The message is the grant: the waiter owns the lock
-- when it hears it, with no second round trip. A grant starts on probation (line_lib.lua); its
-- confirmation is lock_renew.lua's `@<server ms>`.
-- Needs hold_lib.lua's now_ms, settle, take and live_hold and line_lib.lua in front.

-- The handoff window in ms (lockkit_protocol::lock::HANDOFF_WINDOW): how long a looker's
-- reservation lasts.
local HANDOFF_WINDOW_MS = 10

-- Reports the lock busy for `pttl` ({0, pttl, now}); first, the caller's request joins the line,
-- or leaves it (line_lib.lua, stay_in_line).
local function wait_turn(waiting, timeouts, member, keepalive, pttl, now)
  stay_in_line(waiting, timeouts, member, keepalive, now)
  return {0, pttl, now}
end

-- Reports the free lock reserved for another owner for `window` more ms ({0, window, now, 1});
-- the caller joins the waiting set as in wait_turn.
local function reserved_turn(waiting, timeouts, member, keepalive, window, now)
  local busy = wait_turn(waiting, timeouts, member, keepalive, window, now)
  busy[4] = 1
  return busy
end

-- The fenced lock's token counter TTL in ms when a script is given none
-- (lockkit_protocol::fenced_lock::DEFAULT_COUNTER_TTL): one day.
local COUNTER_TTL_MS = 86400000
-- The longest token counter TTL accepted in ms (lockkit_protocol::fenced_lock::MAX_COUNTER_TTL).
local MAX_COUNTER_TTL_MS = 31536000000
-- The TTL the counter gets at each mint (see mint); a script that mints sets it first
-- (use_counter_ttl).
local counter_ttl_ms = COUNTER_TTL_MS

-- Takes the counter TTL a minting script was given (`arg`, ms; absent or '': the default).
-- Returns nil, or an error reply for a malformed one (the caller returns it before writing).
local function use_counter_ttl(arg)
  if arg == nil or arg == '' then
    return nil
  end
  local ms = tonumber(arg)
  if not ms or ms < 1 or ms > MAX_COUNTER_TTL_MS or ms ~= math.floor(ms) then
    return redis.error_reply('ERR lockkit: token counter TTL must be a whole number of ms in 1..' ..
      MAX_COUNTER_TTL_MS .. ', got ' .. arg)
  end
  counter_ttl_ms = ms
  return nil
end

-- Mints the fencing token of the hold `marker` in `key`: max(counter, server clock in µs) + 1,
-- kept in the field `<marker>:token`. Returns it.
-- The counter then expires once the server clock has passed the new token by counter_ttl_ms
-- (PEXPIREAT token in ms + 1 + TTL): every mint pushes that on, and a counter ahead of the clock
-- lives until the clock catches up. So a token minted after the counter expired, the clock + 1,
-- is greater than every token minted before: the counter is never needed once it is gone, as
-- long as the server clock has not stepped back by more than the TTL since.
local function mint(key, counter, marker)
  local time = redis.call('TIME')
  local clock = tonumber(time[1]) * 1000000 + tonumber(time[2])
  if tonumber(redis.call('GET', counter) or 0) < clock then
    redis.call('SET', counter, clock)
  end
  local token = redis.call('INCR', counter)
  redis.call('PEXPIREAT', counter,
    string.format('%d', math.floor(token / 1000) + 1 + counter_ttl_ms))
  redis.call('HSET', key, marker .. ':token', token)
  return token
end

-- Hands the free lock on to the longest-waiting request still waiting whose client hears it
-- (stale requests are dropped first): a request that takes a hold is granted it (the lock is
-- held by it when this returns, and `counter`, when given, mints its token); a looker is
-- reserved the free lock for the handoff window and woken. Each request tried leaves the waiting
-- set; one whose client did not hear the message is dropped (its grant undone), and the next is
-- tried. Returns 'granted', 'reserved' or nil (nobody waits: the lock stays free). `caller`, when
-- given, is the owner of an acquire running this: the handover stops (nil) at a request of its
-- own, which the caller then takes itself.
local function hand_over(key, handoff, waiting, timeouts, sharded, now, counter, caller)
  return serve_line(waiting, timeouts, now, function(marker, lease, owner, channel)
    if caller and owner == caller then
      return 'stop'
    end
    if lease == 0 then
      if heard(channel, sharded, 'p:' .. marker) then
        redis.call('SET', handoff, owner, 'PX', HANDOFF_WINDOW_MS)
        return 'reserved'
      end
      return 'next'
    end
    local expiry = now + math.min(lease, PROBATION_MS)
    -- The token first: a grant whose expiry has passed by the time it is taken (a long walk
    -- over unheard requests) deletes the key at PEXPIREAT, and the token field goes with it
    -- (minted after, it would make a new key holding only the token, with no expiry).
    local token = 0
    if counter then
      token = mint(key, counter, marker)
    end
    local count = take(key, owner, marker, expiry, nil, false)
    if heard(channel, sharded, grant_message(count, token, now, expiry, marker)) then
      return 'granted'
    end
    settle(key, now, marker)
    return 'next'
  end)
end

-- What a caller that found the lock handed over to another request is told: the grantee's
-- probation (busy) or the reservation's window (reserved); it joins the waiting set.
local function handed_turn(key, handoff, waiting, timeouts, member, keepalive, how, now)
  if how == 'reserved' then
    return reserved_turn(waiting, timeouts, member, keepalive, redis.call('PTTL', handoff), now)
  end
  return wait_turn(waiting, timeouts, member, keepalive, redis.call('PTTL', key), now)
end

-- For a free lock about to be taken by `owner` (request `member`, marker `marker`): the reply that
-- refuses it when the lock must go to someone else first, else nil. Someone else first: a looker
-- the lock is reserved for, or a request of another owner at the head of the waiting set (it is
-- granted the lock now, see hand_over). A reservation for `owner` itself is used up, unless only
-- looking (`look`). Changes nothing else when nil is returned.
local function turn_of_another(key, handoff, waiting, timeouts, owner, member, keepalive, look,
                               sharded, now, counter)
  local reserved = redis.call('GET', handoff)
  if reserved and reserved ~= owner then
    return reserved_turn(waiting, timeouts, member, keepalive, redis.call('PTTL', handoff), now)
  end
  if reserved and not look then
    redis.call('DEL', handoff)
  end
  if reserved or redis.call('EXISTS', waiting) == 0 then
    return nil
  end
  prune(waiting, timeouts, now)
  local head = redis.call('ZRANGE', waiting, 0, 0)[1]
  if not head then
    return nil
  end
  local _, _, head_owner = parse_request(head)
  if head_owner == owner then
    return nil
  end
  local how = hand_over(key, handoff, waiting, timeouts, sharded, now, counter, owner)
  if not how then
    return nil
  end
  return handed_turn(key, handoff, waiting, timeouts, member, keepalive, how, now)
end

-- Takes both forms of the request of `marker` (taking and only looking) out of the waiting set:
-- the caller takes the lock.
local function leave_as_holder(waiting, timeouts, marker, lease, owner, channel)
  leave_waiting(waiting, timeouts, request(marker, lease, owner, channel))
  leave_waiting(waiting, timeouts, request(marker, 0, owner, channel))
end

-- Gives back the hold `marker` (lock_release.lua and fenced_lock_release.lua): ends it and every
-- hold whose lease ran out; the key then expires with the latest hold left. When none is left,
-- hands the lock over (hand_over). Returns the release script's reply.
local function release_hold(key, handoff, waiting, timeouts, marker, sharded, counter)
  local now = now_ms()
  local held = give_back(key, now, marker)
  if held then
    return held
  end
  hand_over(key, handoff, waiting, timeouts, sharded, now, counter)
  return {1, 0}
end

-- Takes the request `member` out of the waiting set because its call stopped waiting
-- (lock_cancel.lua): a grant made to it and not yet claimed is given back, and a reservation made
-- for its owner ends; either way the lock goes to the next request. So does a free lock that is
-- reserved for nobody while requests wait: a reservation that lapsed unused (a multi-lock member
-- whose other members were still busy passes it on this way once its window has passed; nothing
-- else would wake the next request before its keep-alive retry). Returns {1} when the request
-- was there (waiting, granted or reserved), {0} otherwise.
local function cancel_request(key, handoff, waiting, timeouts, member, sharded, counter)
  local removed = redis.call('ZREM', timeouts, member) + redis.call('ZREM', waiting, member)
  local marker, _, owner = parse_request(member)
  if not marker then
    return {removed > 0 and 1 or 0}
  end
  local now = now_ms()
  if redis.call('EXISTS', key) == 1 and live_hold(key, marker, now) then
    if not give_back(key, now, marker) then
      hand_over(key, handoff, waiting, timeouts, sharded, now, counter)
    end
    removed = 1
  end
  if redis.call('GET', handoff) == owner then
    redis.call('DEL', handoff)
    removed = 1
  end
  if redis.call('EXISTS', key) == 0 and redis.call('EXISTS', handoff) == 0 then
    hand_over(key, handoff, waiting, timeouts, sharded, now, counter)
  end
  if removed > 0 then
    return {1}
  end
  return {0}
end
