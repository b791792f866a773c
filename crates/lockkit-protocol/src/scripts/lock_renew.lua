-- lock_renew: extend (or only check) many holds in one round trip. Used by the watchdog.
--
-- KEYS[i]      lock key of the i-th hold (all in one cluster slot when clustered)
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to; 0 = only check that the hold is still there
--
-- Reply        array with one integer per hold: 1 = the hold is there (and was extended),
--              0 = the hold is gone (lease ran out, force-unlocked, or Redis lost it, or
--              something else overwrote the key with another type: one bad key must not fail
--              the renewal of every other hold in the batch)
--
-- A hold that was released is never revived: renewal looks for the hold's own marker, which the
-- release deletes in the same atomic step. The TTL is never shortened.
local result = {}
for i, key in ipairs(KEYS) do
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
