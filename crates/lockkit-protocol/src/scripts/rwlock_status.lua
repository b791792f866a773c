-- rwlock_status: the state of a read-write lock, as seen by some owners. Read-only in effect:
-- it only purges holds that have already expired.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries (see rwlock_acquire.lua)
-- ARGV     owner ids whose hold counts are reported, added up (none: both counts are 0)
--
-- Reply    {mode, read_holds, write_holds, pttl}: mode 0 = free, 1 = read, 2 = write; the owners'
--          read and write hold counts, summed; the lock key's PTTL (-2: free, -1: no expiry)

local key, expiries = KEYS[1], KEYS[2]
purge(key, expiries, now_ms())
local modes = {read = 1, write = 2}
local mode = redis.call('HGET', key, 'mode')
local reads, writes = 0, 0
for _, owner in ipairs(ARGV) do
  reads = reads + tonumber(redis.call('HGET', key, 'r:' .. owner) or 0)
  writes = writes + tonumber(redis.call('HGET', key, 'w:' .. owner) or 0)
end
return {modes[mode] or 0, reads, writes, redis.call('PTTL', key)}
