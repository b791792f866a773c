-- rwlock_acquire: take one read or write hold of a reentrant read-write lock.
--
-- KEYS[1]  lock key: a HASH.
--            mode         'read' (only read holds) or 'write' (one owner's write holds, and maybe
--                         read holds of that same owner: the downgrade path)
--            r:<owner>    that owner's read hold count
--            w:<owner>    that owner's write hold count (one owner at most)
--            #<hold>      one outstanding hold (the hold marker); value = the count field it
--                         belongs to (r:<owner> or w:<owner>), so it records mode and owner
-- KEYS[2]  expiries: a ZSET, member = hold marker, score = that hold's own expiry in server ms
--          (from TIME). Every hold expires on its own; both keys expire with the latest hold.
-- ARGV[1]  owner id   (<client id>:<task>)
-- ARGV[2]  hold marker (#<client id>:<sequence>), unique per acquire request
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  'r' for a read hold, 'w' for a write hold
--
-- Reply    {1, hold_count}  acquired; hold_count is the owner's count in that mode after this hold
--          {0, wait_ms}     busy; wait_ms bounds how long the conflicting holds can last: for a
--                           reader, the writer's latest write hold; for a writer, every hold (the
--                           key's TTL; -1 when the key has no expiry, not written by lockkit)
--          {2, read_holds}  refused: a write hold asked by an owner that holds only read holds
--                           (an upgrade, which could never be granted while it waits on itself)
--
-- Rules: a read hold is granted unless another owner writes; a write hold only when the lock is
-- free or the owner already writes. Expired holds are purged first. Idempotent per request: when
-- the connection drops after the script ran, the client re-sends the same request; the marker is
-- already there, so the hold is not counted twice.

local key, expiries = KEYS[1], KEYS[2]
local owner, marker, want = ARGV[1], ARGV[2], ARGV[4]
local now = now_ms()
local expiry = now + tonumber(ARGV[3])
purge(key, expiries, now)

-- A re-sent request whose first run took the hold: report it, count nothing.
local field = redis.call('HGET', key, marker)
if field then
  local score = redis.call('ZSCORE', expiries, marker)
  if not score or tonumber(score) < expiry then
    redis.call('ZADD', expiries, expiry, marker)
    settle(key, expiries, false)
  end
  return {1, tonumber(redis.call('HGET', key, field))}
end

local mode = redis.call('HGET', key, 'mode')
local rfield, wfield = 'r:' .. owner, 'w:' .. owner
local writes = mode == 'write' and redis.call('HEXISTS', key, wfield) == 1

if want == 'w' then
  field = wfield
  if mode == 'read' and redis.call('HEXISTS', key, rfield) == 1 then
    return {2, tonumber(redis.call('HGET', key, rfield))}
  end
  if mode and not writes then
    return {0, redis.call('PTTL', key)}
  end
else
  field = rfield
  if mode == 'write' and not writes then
    -- In write mode every hold is the writer's: few (its reentrancy depth).
    local latest = now
    local holds = redis.call('ZRANGE', expiries, 0, -1, 'WITHSCORES')
    for i = 1, #holds, 2 do
      local of = redis.call('HGET', key, holds[i])
      if of and string.sub(of, 1, 2) == 'w:' then
        latest = math.max(latest, tonumber(holds[i + 1]))
      end
    end
    if latest > now then
      return {0, latest - now}
    end
    return {0, redis.call('PTTL', key)} -- no expiry recorded (not written by lockkit)
  end
end

local count = redis.call('HINCRBY', key, field, 1)
redis.call('HSET', key, marker, field)
if not mode then
  redis.call('HSET', key, 'mode', want == 'w' and 'write' or 'read')
end
redis.call('ZADD', expiries, expiry, marker)
settle(key, expiries, false)
return {1, count}
