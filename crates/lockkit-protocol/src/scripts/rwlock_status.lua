-- rwlock_status: the state of a read-write lock, as seen by one owner. Read-only in effect:
-- it only purges holds that have already expired.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries (see rwlock_acquire.lua)
-- ARGV[1]  owner id whose hold counts are reported
--
-- Reply    {mode, read_holds, write_holds, pttl}: mode 0 = free, 1 = read, 2 = write; the owner's
--          read and write hold counts; the lock key's PTTL (-2: free, -1: no expiry)

local key, expiries, owner = KEYS[1], KEYS[2], ARGV[1]
purge(key, expiries, now_ms())
local modes = {read = 1, write = 2}
local mode = redis.call('HGET', key, 'mode')
return {
  modes[mode] or 0,
  tonumber(redis.call('HGET', key, 'r:' .. owner) or 0),
  tonumber(redis.call('HGET', key, 'w:' .. owner) or 0),
  redis.call('PTTL', key),
}
