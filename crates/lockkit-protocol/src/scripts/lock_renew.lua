-- lock_renew: extend (or only check) many holds in one round trip. Used by the watchdog for every
-- kind whose main key is a lock HASH with hold markers (lock, fenced lock, fair lock).
--
-- KEYS         the keys of each hold, `stride` keys per hold (stride = #KEYS / (#ARGV / 2)); the
--              first of each hold's keys is its lock HASH, the others are not touched
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to (now + lease); 0 = only check that the hold
--              is still there; `@<server ms>` = extend it to that instant (the confirmation of a
--              granted hold: its grant's time + its lease, see handoff_lib.lua)
--
-- Reply        array with one integer per hold: 1 = the hold is live (and was extended),
--              0 = the hold is gone (its own lease ran out, force-unlocked, or Redis lost it, or
--              something else overwrote the key with another type: one bad key must not fail
--              the renewal of every other hold in the batch)
--
-- Only the named hold's own expiry moves (hold_lib.lua): renewing one hold never keeps another
-- alive. Holds whose lease ran out are ended first, so an expired hold is never revived; a
-- released hold has no marker left to find. Expiries are never shortened.
local holds = #ARGV / 2
local stride = #KEYS / holds
local now = now_ms()
local result = {}
for i = 1, holds do
  result[i] = renew_hold(KEYS[stride * (i - 1) + 1], ARGV[2 * i - 1], ARGV[2 * i], now)
end
return result
