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
-- KEYS[3]  waiting ZSET: the line (line_lib.lua; a request is `<marker> <lease> <r|w>:<owner>
--          <channel>`)
-- KEYS[4]  timeouts ZSET: each request's keep-alive deadline
-- ARGV[1]  owner id   (<client id>:<task>)
-- ARGV[2]  hold marker (#<client id>:<sequence>), the same for every try of one acquire call
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  'r' for a read hold, 'w' for a write hold
-- ARGV[5]  the calling client's own channel for the lock: a grant to this call is published there
-- ARGV[6]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[7]  keep-alive in ms: when refused, join the line (or stay in it) until now + keep-alive;
--          0 or absent = do not wait: never join, and leave the line if this request is in it
--
-- Reply    {1, hold_count}   acquired; hold_count is the owner's count in that mode after this
--                            hold
--          {0, wait_ms, now} busy; wait_ms bounds how long the holds in the way can last: for a
--                            reader that a writer keeps out, the writer's latest write hold;
--                            otherwise every hold (the key's TTL; -1 when the key has no expiry,
--                            not written by lockkit); now = the server clock (ms)
--          {2, read_holds}   refused: a write hold asked by an owner that holds only read holds
--                            (an upgrade, which could never be granted while it waits on itself)
--
-- Rules: a read hold fits unless another owner writes; a write hold only a free lock (or an owner
-- that already writes). The line is FIFO (rwlock_lib.lua): the line is served first (grant_line,
-- stopping at this call's own request), and a call takes the lock only when nobody waits ahead of
-- it; a re-entry (the owner writes already, or reads in a read phase) is granted at once, never
-- waits in the line (it would wait behind a request that waits for it). Expired holds are purged
-- first. Idempotent per request: a request re-sent after its first run took the hold (or a
-- release granted it) finds its marker, counts nothing more and reports it.

local key, expiries, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, marker, want = ARGV[1], ARGV[2], ARGV[4]
local channel, sharded, keepalive = ARGV[5], ARGV[6], ARGV[7] or '0'
local member = request(marker, ARGV[3], want .. ':' .. owner, channel)
local now = now_ms()
local expiry = now + tonumber(ARGV[3])
purge(key, expiries, now)

-- A re-sent request whose first run took the hold, or a request a release granted: report it,
-- count nothing.
local field = redis.call('HGET', key, marker)
if field then
  local score = redis.call('ZSCORE', expiries, marker)
  if not score or tonumber(score) < expiry then
    redis.call('ZADD', expiries, expiry, marker)
    settle(key, expiries, false)
  end
  leave_waiting(waiting, timeouts, member)
  return {1, tonumber(redis.call('HGET', key, field))}
end

local mode = redis.call('HGET', key, 'mode')
local rfield, wfield = 'r:' .. owner, 'w:' .. owner
local writes = mode == 'write' and redis.call('HEXISTS', key, wfield) == 1
local reads = mode == 'read' and redis.call('HEXISTS', key, rfield) == 1

if want == 'w' and reads then
  leave_waiting(waiting, timeouts, member)
  return {2, tonumber(redis.call('HGET', key, rfield))}
end

local reply
field = want == 'w' and wfield or rfield
if not (writes or (want == 'r' and reads)) then
  -- Not a re-entry: the line first, then this call if it is at the head and fits.
  grant_line(key, expiries, waiting, timeouts, sharded, now, marker)
  mode = redis.call('HGET', key, 'mode')
  local head = head_of_line(waiting)
  local fits = (want == 'w' and not mode) or (want == 'r' and mode ~= 'write')
  if not fits or (head ~= nil and head ~= member) then
    stay_in_line(waiting, timeouts, member, keepalive, now)
    local wait = redis.call('PTTL', key)
    if want == 'r' and mode == 'write' then
      -- In write mode every hold is the writer's: few (its reentrancy depth).
      local latest = 0
      local holds = redis.call('ZRANGE', expiries, 0, -1, 'WITHSCORES')
      for i = 1, #holds, 2 do
        local of = redis.call('HGET', key, holds[i])
        if of and string.sub(of, 1, 2) == 'w:' then
          latest = math.max(latest, tonumber(holds[i + 1]))
        end
      end
      if latest > now then
        wait = latest - now
      end
    end
    reply = {0, math.max(wait, -1), now}
  end
end

if not reply then
  local count = redis.call('HINCRBY', key, field, 1)
  redis.call('HSET', key, marker, field)
  if not mode then
    redis.call('HSET', key, 'mode', want == 'w' and 'write' or 'read')
  end
  redis.call('ZADD', expiries, expiry, marker)
  settle(key, expiries, false)
  leave_waiting(waiting, timeouts, member)
  reply = {1, count}
end
-- What this call left (it took a read hold, was refused, or left the line) may let the next head
-- in: readers behind this one.
grant_line(key, expiries, waiting, timeouts, sharded, now, nil)
return reply
