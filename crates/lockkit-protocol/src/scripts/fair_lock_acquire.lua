-- fair_lock_acquire: take one hold of a fair lock, or join (or stay in) its queue of waiters.
--
-- KEYS[1]  lock key: a HASH laid out as the reentrant lock's (see hold_lib.lua): field
--          <owner> = that owner's hold count, field #<hold> (the hold marker) = `<expiry> <owner>`,
--          that hold's own expiry in server ms. The key expires with the latest live hold.
-- KEYS[2]  queue key: a LIST of waiter ids in request order; the head is next in line
-- KEYS[3]  timeouts key: a ZSET, waiter id -> deadline (server time in ms) by which the waiter
--          must run this script again, or be dropped from the queue
-- ARGV[1]  owner id    (opaque)
-- ARGV[2]  hold marker (#<client id>:<sequence>), unique per request
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  waiter id   (<client id>:w<sequence>), unique per acquire call
-- ARGV[5]  keep-alive in milliseconds: when the lock cannot be granted, join the queue (or stay in
--          it) until now + keep-alive; 0 = do not wait: never queue, and leave the queue if this
--          waiter is in it (`try_lock` with a zero wait, or the last try of a wait that ran out)
-- ARGV[6]  the lock's channel: the next waiter is named on its own client's channel,
--          `<channel>:<client id>` (fair_lib.lua)
-- ARGV[7]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, hold_count}  acquired; hold_count is the owner's count after this hold
--          {0, wait_ms}     not acquired; nothing changes for this waiter without a message for
--                           at most wait_ms: what is left of the holder's latest hold while the
--                           lock is held (-1: the key has no expiry), else the time the waiter
--                           first in line has left to take it
--
-- The lock is granted to its owner again (re-entry) at any time; otherwise only when it is free
-- and the queue is empty or headed by this waiter. Waiters at the head whose deadline has passed
-- are dropped first (they died or gave up); when that leaves a free lock to a live waiter, it is
-- named on the channel.
--
-- Every hold has its own lease, as in lock_acquire.lua; holds whose lease ran out are ended first.
-- Idempotent per request: a re-sent request whose first run took the hold finds its marker and
-- counts nothing; a re-sent request that queued only refreshes the waiter's deadline (a waiter is
-- in the queue exactly when it has a deadline in the ZSET, so it is never queued twice).
-- The queue's TTLs are never shortened.
local key, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local owner, marker, waiter, channel = ARGV[1], ARGV[2], ARGV[4], ARGV[6]
local lease, keepalive = tonumber(ARGV[3]), tonumber(ARGV[5])

local now = now_ms()
local latest = settle(key, now, nil)

-- Drop stale waiters at the head. This waiter is alive (it is running this script), so its own
-- entry is never dropped here.
local head, purged = drop_stale_heads(queue, timeouts, now, waiter)

local function extend(k, ms)
  if redis.call('PTTL', k) < ms then
    redis.call('PEXPIRE', k, ms)
  end
end

-- A re-sent request whose first run took the hold: report it, count nothing.
local expiry = live_hold(key, marker, now)
if expiry then
  return {1, take(key, owner, marker, math.max(expiry, now + lease), latest, true)}
end

-- Re-entry by the owner: granted whoever waits.
if latest and redis.call('HEXISTS', key, owner) == 1 then
  local count = take(key, owner, marker, now + lease, latest, false)
  if redis.call('ZREM', timeouts, waiter) == 1 then
    redis.call('LREM', queue, 1, waiter)
  end
  return {1, count}
end

local free = not latest

-- Free, and nobody is ahead of this waiter.
if free and (not head or head == waiter) then
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', timeouts, waiter)
  end
  return {1, take(key, owner, marker, now + lease, nil, false)}
end

-- Not granted: queue up, or refresh the deadline and keep the place. A waiter that will not wait
-- (keep-alive 0) leaves instead, in this same script, so a client that vanishes after its last
-- try leaves nothing in the queue to hold the others up. Its leaving changes the head only when
-- the lock is held (a free lock with this waiter at the head was taken above), and the release
-- names the next waiter then.
if keepalive > 0 then
  if not redis.call('ZSCORE', timeouts, waiter) then
    redis.call('RPUSH', queue, waiter)
  end
  redis.call('ZADD', timeouts, now + keepalive, waiter)
  extend(queue, keepalive)
  extend(timeouts, keepalive)
elseif redis.call('ZREM', timeouts, waiter) == 1 then
  redis.call('LREM', queue, 1, waiter)
end

if not free then
  -- The latest live hold's own expiry, not the key's PTTL (see lock_acquire.lua).
  return {0, latest - now}
end

-- Free, but another waiter is first in line. If dropping stale waiters just made it the head,
-- nobody has told it yet.
if purged then
  name_next(channel, ARGV[7], head)
end
return {0, tonumber(redis.call('ZSCORE', timeouts, head)) - now}
