-- semaphore_renew: extend (or only check) many semaphore holds in one round trip. Used by the
-- watchdog; both semaphore kinds.
--
-- KEYS[2i-1]   main HASH of the i-th hold's semaphore (see semaphore_lib.lua)
-- KEYS[2i]     leases ZSET of the i-th hold's semaphore
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to; 0 = only check that it is still there
--
-- Reply        array with one integer per hold: 1 = the hold is live (and was extended),
--              0 = gone (lease ended, released by id, or a key overwritten with another type:
--              one bad key must not fail the renewal of every other hold in the batch)
--
-- A hold whose lease has ended is never revived, even before a purge has removed it; nor is a
-- released one (its marker left the ZSET in the same atomic step). The lease is never shortened.
local now = now_ms()
local result = {}
for i = 1, #KEYS / 2 do
  local main, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local marker, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  result[i] = 0
  if redis.call('TYPE', main)['ok'] == 'hash' and redis.call('TYPE', leases)['ok'] == 'zset' then
    local score = tonumber(redis.call('ZSCORE', leases, marker))
    if score and score > now then
      if lease > 0 and score < now + lease then
        redis.call('ZADD', leases, now + lease, marker)
      end
      result[i] = 1
    end
  end
end
return result
