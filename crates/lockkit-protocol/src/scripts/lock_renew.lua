-- lock_renew: extend (or only check) many holds in one round trip. Used by the watchdog for every
-- kind whose main key is a lock HASH with hold markers (lock, fenced lock, fair lock).
--
-- KEYS         the keys of each hold, `stride` keys per hold (stride = #KEYS / (#ARGV / 2)); the
--              first of each hold's keys is its lock HASH, the others are not touched
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
local holds = #ARGV / 2
local stride = #KEYS / holds
local result = {}
for i = 1, holds do
  local key = KEYS[stride * (i - 1) + 1]
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
