-- lock_hold_count: the hold count of some owners of a reentrant hash lock (lock, fenced lock, fair
-- lock), counting live holds only. Read-only in effect: it only ends holds whose lease has run out
-- (see hold_lib.lua), which every other script would end first too.
--
-- KEYS[1]  lock key (see hold_lib.lua)
-- ARGV     owner ids whose hold counts are added up (none: 0)
--
-- Reply    {count}: the owners' live holds, summed; {0} when the lock is free
--
-- A key of another type is reported by Redis (WRONGTYPE), not touched.
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  return {0}
end
settle(key, now_ms(), nil)
local count = 0
for _, owner in ipairs(ARGV) do
  count = count + tonumber(redis.call('HGET', key, owner) or 0)
end
return {count}
