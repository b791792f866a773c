-- rwlock_renew: extend (or only check) many read-write lock holds in one round trip. Used by the
-- watchdog.
--
-- KEYS[2i-1]   lock key of the i-th hold (see rwlock_acquire.lua)
-- KEYS[2i]     expiries of the i-th hold (all keys in one cluster slot when clustered)
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to; 0 = only check that the hold is still there
--
-- Reply        array with one integer per hold: 1 = the hold is there (and was extended),
--              0 = the hold is gone (its own lease ran out, force-unlocked, lost by Redis, or a
--              key overwritten with another type: one bad key must not fail the whole batch)
--
-- Only the named hold's own expiry moves: a reader's renewal never keeps another reader's hold
-- alive. Expired holds are purged first, so an expired hold is never revived; a released hold
-- has no marker left to find. Expiries are never shortened.

local now = now_ms()
local result = {}
for i = 1, #ARGV / 2 do
  local key, expiries = KEYS[2 * i - 1], KEYS[2 * i]
  local marker, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  result[i] = 0
  if redis.call('TYPE', key)['ok'] == 'hash' and redis.call('TYPE', expiries)['ok'] == 'zset' then
    purge(key, expiries, now)
    local expiry = redis.call('ZSCORE', expiries, marker)
    if expiry and redis.call('HEXISTS', key, marker) == 1 then
      if lease > 0 and tonumber(expiry) < now + lease then
        redis.call('ZADD', expiries, now + lease, marker)
        settle(key, expiries, false)
      end
      result[i] = 1
    end
  end
end
return result
