-- semaphore_renew: extend (or only check) many semaphore holds in one round trip. Used by the
-- watchdog, and to confirm a granted hold; both semaphore kinds.
--
-- KEYS         the keys of each hold, `stride` keys per hold (stride = #KEYS / (#ARGV / 2)): its
--              main HASH and leases ZSET first (see semaphore_lib.lua), the others not touched
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to (now + lease); 0 = only check that it is
--              still there; `@<server ms>` = extend it to that instant (the confirmation of a
--              granted hold: its grant's time + its lease, see line_lib.lua)
--
-- Reply        array with one integer per hold: 1 = the hold is live (and was extended),
--              0 = gone (lease ended, released by id, or a key overwritten with another type:
--              one bad key must not fail the renewal of every other hold in the batch)
--
-- A hold whose lease has ended is never revived, even before a purge has removed it; nor is a
-- released one (its marker left the ZSET in the same atomic step). The lease is never shortened.
local now = now_ms()
local holds = #ARGV / 2
local stride = #KEYS / holds
local result = {}
for i = 1, holds do
  local main, leases = KEYS[stride * (i - 1) + 1], KEYS[stride * (i - 1) + 2]
  local marker, arg = ARGV[2 * i - 1], ARGV[2 * i]
  local target
  if string.sub(arg, 1, 1) == '@' then
    target = tonumber(string.sub(arg, 2))
  elseif tonumber(arg) > 0 then
    target = now + tonumber(arg)
  end
  result[i] = 0
  if redis.call('TYPE', main)['ok'] == 'hash' and redis.call('TYPE', leases)['ok'] == 'zset' then
    local score = tonumber(redis.call('ZSCORE', leases, marker))
    if score and score > now then
      if target and score < target then
        redis.call('ZADD', leases, target, marker)
      end
      result[i] = 1
    end
  end
end
return result
