-- rwlock_renew: extend (or only check) many read-write lock holds in one round trip. Used by the
-- watchdog.
--
-- KEYS         the keys of each hold, `stride` keys per hold (stride = #KEYS / (#ARGV / 2)): its
--              lock key and expiries first (see rwlock_acquire.lua), the others not touched
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to (now + lease); 0 = only check that the hold
--              is still there; `@<server ms>` = extend it to that instant (the confirmation of a
--              granted hold: its grant's time + its lease, see line_lib.lua)
--
-- Reply        array with one integer per hold: 1 = the hold is there (and was extended),
--              0 = the hold is gone (its own lease ran out, force-unlocked, lost by Redis, or a
--              key overwritten with another type: one bad key must not fail the whole batch)
--
-- Only the named hold's own expiry moves: a reader's renewal never keeps another reader's hold
-- alive. Expired holds are purged first, so an expired hold is never revived; a released hold
-- has no marker left to find. Expiries are never shortened.

local now = now_ms()
local holds = #ARGV / 2
local stride = #KEYS / holds
local result = {}
for i = 1, holds do
  local key, expiries = KEYS[stride * (i - 1) + 1], KEYS[stride * (i - 1) + 2]
  local marker, arg = ARGV[2 * i - 1], ARGV[2 * i]
  local target
  if string.sub(arg, 1, 1) == '@' then
    target = tonumber(string.sub(arg, 2))
  elseif tonumber(arg) > 0 then
    target = now + tonumber(arg)
  end
  result[i] = 0
  if redis.call('TYPE', key)['ok'] == 'hash' and redis.call('TYPE', expiries)['ok'] == 'zset' then
    purge(key, expiries, now)
    local expiry = redis.call('ZSCORE', expiries, marker)
    if expiry and redis.call('HEXISTS', key, marker) == 1 then
      if target and tonumber(expiry) < target then
        redis.call('ZADD', expiries, target, marker)
        settle(key, expiries, false)
      end
      result[i] = 1
    end
  end
end
return result
