-- rwlock_release: give back one hold (read or write) of a read-write lock.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries
-- KEYS[3]  waiting ZSET (the line, see rwlock_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  the lock's channel (not used: a grant goes to the waiting client's own channel)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, 0}           released; the owner holds the lock no more (other readers may)
--          {2, hold_count}  released; the same owner still holds hold_count holds (read + write)
--          {0, 0}           the hold was not there: its lease ran out, the lock was force-unlocked,
--                           or this very hold was released already
--
-- Whatever the release frees (this hold, and holds whose lease ran out) is granted to the line
-- (rwlock_lib.lua, grant_line): the end of a write phase grants the head writer or every reader at
-- the head up to the next writer, the last hold's release the head writer; one message per
-- granted call, on its client's channel, nothing to anyone else.

local key, expiries, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, sharded = ARGV[1], ARGV[3]
local now = now_ms()
purge(key, expiries, now)

local reply = {0, 0}
local field, left = drop(key, expiries, marker)
if field then
  settle(key, expiries, string.sub(field, 1, 2) == 'w:' and left <= 0)
  local owner = string.sub(field, 3)
  local held = tonumber(redis.call('HGET', key, 'r:' .. owner) or 0)
    + tonumber(redis.call('HGET', key, 'w:' .. owner) or 0)
  reply = held > 0 and {2, held} or {1, 0}
end
grant_line(key, expiries, waiting, timeouts, sharded, now, nil)
return reply
