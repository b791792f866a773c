-- fair_lock_renew: extend (or only check) many fair-lock holds in one round trip. Used by the
-- watchdog.
--
-- KEYS[3i-2]   lock key of the i-th hold; KEYS[3i-1], KEYS[3i] its queue and timeouts keys (not
--              touched: renewal concerns holds, not waiters)
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to; 0 = only check that the hold is still there
--
-- Reply        array with one integer per hold: 1 = the hold is there (and was extended),
--              0 = the hold is gone (lease ran out, force-unlocked, lost by Redis, or the key was
--              overwritten with another type: one bad key must not fail the whole batch)
--
-- A released hold is never revived: renewal looks for the hold's own marker, which the release
-- deletes in the same atomic step. The TTL is never shortened.
local result = {}
for i = 1, #ARGV / 2 do
  local key = KEYS[3 * i - 2]
  local marker, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  if redis.call('TYPE', key)['ok'] == 'hash' and redis.call('HEXISTS', key, marker) == 1 then
    if lease > 0 and redis.call('PTTL', key) < lease then
      redis.call('PEXPIRE', key, lease)
    end
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
