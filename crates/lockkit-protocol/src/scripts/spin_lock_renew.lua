-- spin_lock_renew: extend (or only check) many spin-lock holds in one round trip.
--
-- KEYS[i]      lock key of the i-th hold (one key per hold)
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend it to; 0 = only check
--
-- Reply        one integer per hold: 1 = still held with this marker (and extended), 0 = gone.
-- A key of another type counts as gone, so one bad key cannot fail the whole batch.
local result = {}
for i, key in ipairs(KEYS) do
  local marker, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  if redis.call('TYPE', key)['ok'] == 'string' and redis.call('GET', key) == marker then
    if lease > 0 and redis.call('PTTL', key) < lease then
      redis.call('PEXPIRE', key, lease)
    end
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
